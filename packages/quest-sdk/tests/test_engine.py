"""The shared training engine: schedule, batches, checkpoints and bitwise resume, telemetry rows, tracking."""

import json
import math

import pytest
import torch
from torch import nn

from quest_core import MultiheadAttention
from quest_sdk.engine import EpochBatches, Trainer, TrainSpec, step_generator, warmup_cosine
from quest_sdk.task import RunContext


class TinyAttentionModel(nn.Module):
    def __init__(self, variant: str = "quest"):
        super().__init__()
        self.embed = nn.Linear(3, 16)
        self.attn = MultiheadAttention(16, 2, variant=variant, batch_first=True)
        self.drop = nn.Dropout(0.1)  # consumes the global RNG: resume must restore it
        self.head = nn.Linear(16, 2)

    def forward(self, x_bn3):
        h_bnd = self.embed(x_bn3)
        h_bnd = self.drop(self.attn(h_bnd, h_bnd, h_bnd, need_weights=False)[0])
        return self.head(h_bnd.mean(1))


def make_data(n: int = 64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, 3, generator=gen)
    return x, (x[:, :, 0].mean(1) > 0).long()


def train(out_dir, steps: int = 12, crash_step: int | None = None, seed: int = 3, checkpoint_every: int = 4):
    torch.manual_seed(seed)
    x, y = make_data()
    model = TinyAttentionModel()
    ctx = RunContext(out_dir, "quest", seed=seed, progress=False, checkpoint_every=checkpoint_every)
    trainer = Trainer(model, ctx, TrainSpec(steps=steps, lr=1e-2, weight_decay=0.1, warmup_steps=2, log_every=3),
                      "test")
    batches = trainer.epoch_batches(len(x), 16)

    def loss_fn(m, idx, rng):
        noise = 0.01 * torch.randn(len(idx), 5, 3, generator=rng)
        return nn.functional.cross_entropy(m(x[idx] + noise), y[idx])

    class Stop(Exception):
        pass

    def limited(start):
        for step, idx in enumerate(batches.from_step(start), start):
            if crash_step is not None and step == crash_step:
                raise Stop
            yield idx

    try:
        trainer.fit(limited, loss_fn)
    except Stop:
        pass
    finally:
        ctx.close()
    return model, trainer


def test_warmup_cosine_shape():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(100, 100, 10, floor=0.01) == pytest.approx(0.01)
    assert warmup_cosine(55, 100, 10, floor=0.0) == pytest.approx(0.5)


def test_step_generator_depends_on_seed_step_and_stream_only():
    draw = lambda *a: torch.rand(3, generator=step_generator(*a))  # noqa: E731
    assert torch.equal(draw(1, 5), draw(1, 5))
    assert not torch.equal(draw(1, 5), draw(1, 6))
    assert not torch.equal(draw(1, 5), draw(2, 5))
    assert not torch.equal(draw(1, 5, 0), draw(1, 5, 1))


def test_epoch_batches_cover_each_epoch_once_and_shard():
    full = EpochBatches(10, 4, seed=0)
    assert full.per_epoch == 2
    epoch0 = torch.cat([full.batch(0), full.batch(1)])
    assert len(set(epoch0.tolist())) == 8
    assert not torch.equal(full.batch(0), full.batch(2))  # a new permutation in epoch 1
    halves = [EpochBatches(10, 4, seed=0, rows=slice(r * 2, r * 2 + 2)) for r in (0, 1)]
    assert torch.equal(torch.cat([h.batch(3) for h in halves]), full.batch(3))
    with pytest.raises(ValueError, match="fewer than one batch"):
        EpochBatches(3, 4, seed=0)


def test_resume_after_interruption_is_bitwise_equal(tmp_path):
    reference, _ = train(tmp_path / "straight")
    train(tmp_path / "resumed", crash_step=7)  # stops before step 7; the last checkpoint is at step 4
    assert json.loads((tmp_path / "resumed" / "events.jsonl").read_text().splitlines()[-1])["step"] == 7
    resumed, trainer = train(tmp_path / "resumed")
    assert trainer.resumed_from_step == 4
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    rows = [json.loads(line) for line in (tmp_path / "resumed" / "events.jsonl").read_text().splitlines()]
    straight = [json.loads(line) for line in (tmp_path / "straight" / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in straight]  # rows after the checkpoint replaced, not doubled
    assert rows == straight


def test_events_rows_carry_loss_lr_grad_norm_and_per_layer_telemetry(tmp_path):
    train(tmp_path / "run", steps=6)
    rows = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 4, 6]  # steps 0, 3 and the last, counted after the optimizer step
    for row in rows:
        assert {"loss", "lr", "grad_norm", "max_logit", "entropy_mean", "attn/max_logit"} <= row.keys()
        assert all(math.isfinite(v) for v in row.values())
    assert any((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "checkpoint.pt").exists()
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 6


def test_unreadable_checkpoint_is_reported_and_training_starts_over(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    _, trainer = train(tmp_path / "run", steps=3)
    assert trainer.resumed_from_step == 0 and trainer.step == 3
    assert "ignoring unreadable checkpoint" in capsys.readouterr().err


def test_mlflow_tracking_when_configured(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.setenv("QUEST_BENCH_TRACKING", "mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # a local store, no server
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind this switch
    train(tmp_path / "run", steps=4)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 1
    history = mlflow.tracking.MlflowClient().get_metric_history(runs[0].info.run_id, "loss")
    assert [m.step for m in history] == [1, 4]
    assert runs[0].data.params["variant"] == "quest"


def test_unknown_tracker_is_refused_with_the_valid_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEST_BENCH_TRACKING", "wandb")
    with pytest.raises(ValueError, match="unknown tracker.*wandb; valid: tensorboard, mlflow"):
        train(tmp_path / "run", steps=2)
