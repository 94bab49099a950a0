"""Tests of the timeseries task: padding and missing steps never reach valid outputs (every variant), the encoder
against a float64 reference, the shipped sets and the UEA .ts layout on a fixture tree, the corruptions, the
validation split, a tiny run that learns, and a bitwise resume."""

import math

import numpy as np
import pytest
import torch

import quest_core
from quest_timeseries.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_sdk.data import validation_split
from quest_timeseries.data import load
from quest_timeseries.model import SeriesTransformer
from quest_timeseries.task import TimeseriesTask

CHANNELS = 5


def make_model(variant: str, patch_len: int = 1, depth: int = 3, seed: int = 0) -> SeriesTransformer:
    torch.manual_seed(seed)
    model = SeriesTransformer(CHANNELS, 4, variant, patch_len=patch_len, dim=24, depth=depth, num_heads=4,
                              dropout=0.0).eval()
    for module in model.modules():  # move learnable variant gains off their initial values
        if isinstance(module, quest_core.AttentionKernel):
            for p in module.parameters():
                p.data.uniform_(0.5, 2.0)
    return model


def padded(series: list[torch.Tensor], length: int, garbage_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch (B, length, C) of the series, with large random values in the padding, and its observed mask."""
    gen = torch.Generator().manual_seed(garbage_seed)
    x = 100 * torch.randn(len(series), length, CHANNELS, generator=gen)
    observed = torch.zeros(len(series), length, dtype=torch.bool)
    for i, s in enumerate(series):
        x[i, : len(s)], observed[i, : len(s)] = s, True
    return x, observed


@pytest.mark.parametrize("patch_len", [1, 3])
@pytest.mark.parametrize("variant", quest_core.list_variants())
def test_padding_never_reaches_valid_outputs(variant, patch_len):
    model = make_model(variant, patch_len)
    gen = torch.Generator().manual_seed(1)
    short, long1, long2 = (torch.randn(n, CHANNELS, generator=gen) for n in (9, 23, 17))
    with torch.no_grad():
        alone = model(*padded([short], 9))
        torch.testing.assert_close(model(*padded([short], 30)), alone, rtol=1e-5, atol=1e-5)
        together = model(*padded([short, long1, long2], 30))
        if model.blocks[0].attn.kernel.spec.uses_metric:
            # elliptical: its metric is one statistic of the whole batch (by design), but padding never enters it
            torch.testing.assert_close(model(*padded([short, long1, long2], 23, garbage_seed=5)), together,
                                       rtol=1e-5, atol=1e-5)
            return
        for i, s in enumerate([short, long1, long2]):
            torch.testing.assert_close(together[i: i + 1], model(*padded([s], len(s))), rtol=1e-5, atol=1e-5)


def reference_logits(model: SeriesTransformer, x_btc: torch.Tensor, observed_bt: torch.Tensor, variant: str):
    """The model's forward written out in float64 with explicit loops over series and heads: patches, embedding,
    sinusoidal positions, pre-norm blocks with masked softmax attention over the valid tokens only, mean pool."""
    p, dim = model.patch_len, model.dim
    out = []
    for x_tc, obs_t in zip(x_btc, observed_bt):
        t = len(obs_t)
        n_tok = math.ceil(t / p)
        feats, valid = [], []
        for j in range(n_tok):
            vals = torch.zeros(p, CHANNELS, dtype=torch.float64)
            flags = torch.zeros(p, dtype=torch.float64)
            for s in range(p):
                if j * p + s < t and obs_t[j * p + s]:
                    vals[s], flags[s] = x_tc[j * p + s], 1.0
            feats.append(torch.cat([vals.flatten(), flags]))
            valid.append(bool(flags.any()))
        h = torch.stack(feats) @ model.embed.weight.T + model.embed.bias
        pos = torch.tensor([[math.sin(j / 1e4 ** (2 * (i // 2) / dim)) if i % 2 == 0 else
                             math.cos(j / 1e4 ** (2 * (i // 2) / dim)) for i in range(dim)] for j in range(n_tok)],
                           dtype=torch.float64)
        h = (h + pos)[torch.tensor(valid)]  # invalid tokens influence nothing valid: drop them outright
        for block in model.blocks:
            a = block.attn
            heads, hd = a.num_heads, a.head_dim
            q, k, v = (block.norm1(h) @ a.qkv.weight.T + a.qkv.bias).split(dim, -1)
            outs = []
            for head in range(heads):
                qh, kh, vh = (z[:, head * hd:(head + 1) * hd] for z in (q, k, v))
                if variant == "quest":
                    logits = qh @ (kh / kh.norm(dim=-1, keepdim=True)).T
                else:
                    logits = qh @ kh.T / math.sqrt(hd)
                outs.append(logits.softmax(-1) @ vh)
            h = h + torch.cat(outs, -1) @ a.proj.weight.T + a.proj.bias
            h = h + block.mlp(block.norm2(h))
        out.append(model.head(model.norm(h).mean(0)))
    return torch.stack(out)


@pytest.mark.parametrize("patch_len", [1, 2])
@pytest.mark.parametrize("variant", ["softmax", "quest"])
def test_the_encoder_equals_a_float64_reference(variant, patch_len):
    model = make_model(variant, patch_len, depth=2).double()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 11, CHANNELS, generator=gen, dtype=torch.float64)
    observed = torch.arange(11) < torch.tensor([[11], [4], [7]])
    observed[0, 3] = observed[2, 1] = False  # missing steps inside the series, too
    with torch.no_grad():
        torch.testing.assert_close(model(x, observed), reference_logits(model, x, observed, variant),
                                   rtol=1e-10, atol=1e-10)


def test_the_shipped_japanese_vowels():
    data = load("JapaneseVowels", None)
    assert data.classes == [str(i) for i in range(1, 10)]
    assert (len(data.train), len(data.val), len(data.test)) == (216, 54, 370)
    assert data.train.x.shape[1:] == (26, 12) and data.test.x.shape[1:] == (29, 12)
    for split in (data.train, data.val, data.test):
        lengths = split.observed.sum(1)
        assert lengths.min() >= 7 and lengths.max() <= 29
        assert (split.observed == (torch.arange(split.x.shape[1]) < lengths[:, None])).all()  # a prefix, padded
        assert (split.x[~split.observed] == 0).all()
    assert sorted(torch.bincount(data.test.y).tolist()) == sorted([31, 35, 88, 44, 29, 24, 40, 50, 29])
    values = data.train.x[data.train.observed]  # standardised with the training part's statistics
    torch.testing.assert_close(values.mean(0), torch.zeros(12), atol=1e-5, rtol=0)
    torch.testing.assert_close(values.std(0, unbiased=False), torch.ones(12), atol=1e-5, rtol=0)


def test_the_shipped_basic_motions():
    data = load("BasicMotions", None)
    assert data.classes == ["standing", "running", "walking", "badminton"]  # the file's header order
    assert data.train.x.shape == (32, 100, 6) and data.val.x.shape == (8, 100, 6) and data.test.x.shape == (40, 100, 6)
    assert data.train.observed.all() and data.test.observed.all()
    assert torch.bincount(data.test.y).tolist() == [10] * 4 and torch.bincount(data.val.y).tolist() == [2] * 4


def write_ts(path, name: str, rows: list[tuple[list[list[str]], str]], classes: str, equal_length: bool):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# fixture {name}", f"@problemName {name}", "@timeStamps false", "@missing true",
             "@univariate false", "@dimensions 2", f"@equalLength {str(equal_length).lower()}",
             f"@classLabel true {classes}", "@data"]
    lines += [":".join(",".join(channel) for channel in series) + f":{label}" for series, label in rows]
    path.write_text("\n".join(lines) + "\n")


def toy_rows(count: int, seed: int, variable: bool):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        n = int(rng.integers(3, 7)) if variable else 5
        series = [[f"{v:.3f}" for v in rng.normal(size=n) + 5 * c] for c in range(2)]
        rows.append((series, "up" if i % 2 else "down"))
    return rows


def test_the_uea_layout_is_read_from_the_data_root(tmp_path):
    folder = tmp_path / "Multivariate_ts" / "Toy"
    train_rows, test_rows = toy_rows(10, 0, variable=True), toy_rows(4, 1, variable=True)
    train_rows[3][0][1][1] = "?"  # a missing value: that channel of that step is NaN, the step stays observed
    write_ts(folder / "Toy_TRAIN.ts", "Toy", train_rows, "up down", equal_length=False)
    write_ts(folder / "Toy_TEST.ts", "Toy", test_rows, "up down", equal_length=False)
    data = load("Toy", str(tmp_path))
    assert data.classes == ["up", "down"] and "sha256:" in data.revision
    assert (len(data.train), len(data.val), len(data.test)) == (8, 2, 4)
    assert sorted(data.val.y.tolist()) == [0, 1]
    lengths = [len(series[0]) for series, _ in test_rows]
    assert data.test.observed.sum(1).tolist() == lengths and data.test.x.shape == (4, max(lengths), 2)
    # standardised with the mean and std of the training part (not the validation series), ignoring padding
    fit, _ = validation_split(np.array([label for _, label in train_rows]), 0.2)
    fit = fit.tolist()
    raw = [np.array([[float(v) if v != "?" else np.nan for v in ch] for ch in train_rows[i][0]]) for i in fit]
    values = np.concatenate([r.T for r in raw])
    mean, std = np.nanmean(values, 0), np.nanstd(values, 0)
    expected = (float(test_rows[0][0][1][2]) - mean[1]) / std[1]
    assert data.test.x[0, 2, 1].item() == pytest.approx(expected, rel=1e-5)
    assert data.train.x.isfinite().all()

    write_ts(tmp_path / "Multivariate_ts" / "Flat" / "Flat_TRAIN.ts", "Flat", toy_rows(10, 2, False), "up down", True)
    write_ts(tmp_path / "Multivariate_ts" / "Flat" / "Flat_TEST.ts", "Flat", toy_rows(2, 3, False), "up down", True)
    flat = load("Flat", str(tmp_path))
    assert flat.train.x.shape == (8, 5, 2) and flat.test.observed.all()


def test_unknown_or_unplaced_datasets_fail_with_what_was_looked_for(tmp_path):
    with pytest.raises(ValueError, match="--data-root"):
        load("Epilepsy", None)
    with pytest.raises(FileNotFoundError, match=r"Multivariate_ts/Epilepsy/Epilepsy_TRAIN\.ts.*JapaneseVowels"):
        load("Epilepsy", str(tmp_path))
    with pytest.raises(ValueError, match="UEA problem name"):
        load("../JapaneseVowels", str(tmp_path))


def test_the_validation_split_is_disjoint_stratified_and_independent_of_the_run_seed():
    data = load("JapaneseVowels", None)
    assert torch.bincount(data.val.y).tolist() == [6] * 9  # 20 % of 30 per speaker
    rows = lambda s: {tuple(r) for r in s.x.flatten(1).tolist()}  # noqa: E731
    assert not rows(data.train) & rows(data.val) and len(rows(data.train) | rows(data.val)) == 270
    torch.manual_seed(123)
    np.random.seed(123)
    again = load("JapaneseVowels", None)
    assert torch.equal(again.val.x, data.val.x) and torch.equal(again.train.y, data.train.y)
    labels = np.repeat(np.arange(3), [10, 20, 30])
    train, val = validation_split(labels, 0.2)
    assert np.bincount(labels[val.numpy()]).tolist() == [2, 4, 6] and not set(train.tolist()) & set(val.tolist())
    assert torch.equal(val, validation_split(labels, 0.2)[1])
    assert not torch.equal(val, validation_split(labels, 0.2, seed=1)[1])  # the split seed decides it


def test_the_task_declares_its_validation_metric_and_presets_resolve():
    assert TimeseriesTask.validation_metric == "val_acc"
    for preset in TimeseriesTask.presets:
        TimeseriesTask().make_config(preset, {})


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruptions_are_deterministic_and_grow_with_severity(name):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20, CHANNELS, generator=gen)
    observed = torch.arange(20) < torch.tensor([20, 20, 12, 8, 15, 20])[:, None]
    x = x * observed[..., None]
    out = [corrupt(x, observed, name, s, seed=3) for s in SEVERITIES]
    again = corrupt(x, observed, name, 2, seed=3)
    assert torch.equal(again[0], out[1][0]) and torch.equal(again[1], out[1][1])
    other = corrupt(x, observed, name, 2, seed=4)
    assert not (torch.equal(other[0], out[1][0]) and torch.equal(other[1], out[1][1]))
    for cx, cobs in out:
        assert not (cobs & ~observed).any() and (cx[~cobs] == 0).all()  # padding stays padding
    if name == "missing":
        counts = [int(cobs.sum()) for _, cobs in out]
        assert int(observed.sum()) > counts[0] and all(a > b for a, b in zip(counts, counts[1:]))
        assert all((b <= a).all() for (_, a), (_, b) in zip(out, out[1:]))  # nested: more of the same missing
        assert (out[-1][1].sum(1) >= 1).all()
    else:
        change = [float((cx - x).norm()) for cx, _ in out]
        assert 0 < change[0] and all(a < b for a, b in zip(change, change[1:])), change
        assert all(torch.equal(cobs, observed) for _, cobs in out)
    if name == "time_warp":  # a resampling of the series' own values: the endpoints stay
        lengths = observed.sum(1)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(out[-1][0][i, [0, n - 1]], x[i, [0, n - 1]])
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(x, observed, name, 6)
    with pytest.raises(ValueError, match="valid: gaussian_noise"):
        corrupt(x, observed, "fog", 1)


@pytest.mark.parametrize("variant", quest_core.list_variants())
def test_missing_steps_are_masked_not_zeroed(variant):
    """A series with missing steps gives the logits of the series with those steps deleted (at their times)."""
    model = make_model(variant)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 16, CHANNELS, generator=gen)
    observed = torch.ones(1, 16, dtype=torch.bool)
    cx, cobs = corrupt(x, observed, "missing", 3, seed=0)
    keep = cobs[0].nonzero().flatten()
    assert 0 < len(keep) < 16
    with torch.no_grad():
        masked = model(cx, cobs)
        deleted = model(x[:, keep], torch.ones(1, len(keep), dtype=torch.bool), time_bt=keep[None])
        torch.testing.assert_close(masked, deleted, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(masked, model(cx, observed), atol=1e-3)  # zeros as values would be different


def test_a_tiny_run_learns_well_above_the_majority_baseline(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    result = execute(resolve(RunSpec("timeseries", "quest", "tiny", 0, {"epochs": 12, "corruption_samples": 90})),
                     tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert m["test_acc"] > 0.85 and m["majority_acc"] < 0.15 and m["val_acc"] > 0.7
    assert m["mean_class_acc"] > 0.8
    assert {f"corruption_error/{c}" for c in CORRUPTIONS} <= set(m) and 0 < m["corrupted_acc"] < 1
    assert "final_max_logit" in m and len((tmp_path / "run" / "events.jsonl").read_text().splitlines()) >= 10


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_sdk.testing import straight_and_resumed
    from quest_timeseries.experiment import run

    # one epoch of 6 batches of 32 series with random crops (the step's generator) and dropout (the global one)
    cfg = TimeseriesTask().make_config("tiny", {"epochs": 1, "warmup_epochs": 0.5, "batch_size": 32, "dim": 16,
                                                "depth": 1, "augment": True, "corruption_samples": 18, "log_every": 1})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=3)
    assert step == 2 and resumed == straight
    assert {"test_acc", "val_acc", "majority_acc", "corrupted_acc", "final_max_logit"} <= straight.keys()
    rows = [(tmp_path / run_dir / "events.jsonl").read_text() for run_dir in ("straight", "resumed")]
    assert rows[0] == rows[1]
