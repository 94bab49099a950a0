"""The probe's data follow the paper's construction; the model trains; the Bayes ceiling is right."""

import math

import torch

from quest_spurious.data import ProbeData
from quest_spurious.model import ProbeModel


def test_answer_tokens_follow_the_two_distributions():
    data = ProbeData(seq_len=8, key_dim=6, signal_dims=2, signal_var=4.0, bias_norm=3.0, bias_var=0.1)
    gen = torch.Generator().manual_seed(0)
    x_k, x_v, label, pos, is_biased = data.sample(20000, gen)
    rows = torch.arange(len(pos))
    answer = x_k[rows, pos]
    assert 0.47 < is_biased.float().mean() < 0.53
    assert torch.equal(x_v[rows, pos].argmax(-1), label)
    biased = answer[is_biased]
    torch.testing.assert_close(biased.mean(0), data.bias_vector(), atol=0.02, rtol=0)
    torch.testing.assert_close(biased.var(0), torch.full((6,), 0.1), atol=0.01, rtol=0)
    unbiased = answer[~is_biased]
    torch.testing.assert_close(unbiased.var(0), data.sigma_diag(), atol=0.15, rtol=0.05)
    torch.testing.assert_close(unbiased.mean(0), torch.zeros(6), atol=0.05, rtol=0)
    others = x_k.clone()
    others[rows, pos] = math.nan
    flat = others.reshape(-1, 6)
    flat = flat[~flat.isnan().any(1)]
    torch.testing.assert_close(flat.var(0), torch.ones(6), atol=0.03, rtol=0)
    assert torch.allclose(data.bias_vector().norm(), torch.tensor(3.0))


def test_bayes_accuracy_grows_with_the_signal_from_the_uniform_reader():
    accs, uniform = [], []
    for var in (1.0, 2.0, 8.0):
        data = ProbeData(signal_var=var)
        x_k, x_v, label, _, _ = data.sample(4000, torch.Generator().manual_seed(1), biased=False)
        accs.append(data.bayes_accuracy(x_k, x_v, label))
        uniform.append(data.uniform_accuracy(x_v, label))
    # no signal (Σ = I): the optimal reader is the uniform reader (most frequent value), well above 1/C = 0.125
    assert abs(accs[0] - uniform[0]) < 0.02 and 0.2 < uniform[0] < 0.35
    assert accs[0] < accs[1] < accs[2] < 1.0


def test_model_forward_shapes_and_key_norms():
    model = ProbeModel("quest", key_dim=8, num_values=8)
    x_k, x_v = torch.randn(5, 16, 8), torch.nn.functional.one_hot(torch.randint(8, (5, 16)), 8).float()
    assert model(x_k, x_v).shape == (5, 8)
    assert model.keys(x_k).shape == (5, 16, 16)


def test_a_short_run_learns_the_shortcut_and_logs_key_norms(tmp_path):
    import json

    from quest_sdk.task import RunContext
    from quest_spurious.experiment import run
    from quest_spurious.task import SpuriousTask

    task = SpuriousTask()
    cfg = task.make_config("tiny", {"steps": 150, "warmup_steps": 10, "lr": 0.01, "eval_samples": 1000,
                                    "log_every": 50})
    torch.manual_seed(0)
    ctx = RunContext(tmp_path, "softmax", seed=0, progress=False)
    try:
        m = run(cfg, ctx).metrics
    finally:
        ctx.close()
    assert m["biased_acc"] > 0.9  # the shortcut is learned within 150 steps
    assert m["uniform_unbiased_acc"] < m["success_threshold"] < m["bayes_unbiased_acc"]
    assert m["robust_fraction"] == (m["unbiased_acc"] - m["uniform_unbiased_acc"]) / (
        m["bayes_unbiased_acc"] - m["uniform_unbiased_acc"])
    rows = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 51, 101, 150]
    for row in rows:
        assert {"loss", "lr", "grad_norm", "max_logit", "biased_answer_key_norm", "other_key_norm"} <= row.keys()
    assert rows[-1]["lr"] == 0.0  # cosine to 0 at the last step
    # the lazy solution of free keys: the biased answer tokens' keys grow louder than the others
    assert rows[-1]["biased_answer_key_norm"] > 2 * rows[-1]["other_key_norm"]


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_sdk.testing import straight_and_resumed
    from quest_spurious.experiment import run
    from quest_spurious.task import SpuriousTask

    cfg = SpuriousTask().make_config("tiny", {"steps": 12, "warmup_steps": 2, "eval_samples": 200, "log_every": 3})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=4, crash_step=7)
    assert step == 4 and resumed == straight


def test_the_norm_design_puts_the_signal_only_in_the_key_norm():
    """design=norm: isotropic Σ (every dim scaled) and a linear key map. The Bayes reader still beats the uniform
    one, and the answer keys differ from the others in norm but not in mean direction."""
    from quest_spurious.task import SpuriousTask

    cfg = SpuriousTask().make_config("tiny", {"design": "norm", "signal_var": 3.0})
    data = cfg.data()
    torch.testing.assert_close(data.sigma_diag(), torch.full((cfg.key_dim,), 3.0))
    x_k, x_v, label, pos, _ = data.sample(8000, torch.Generator().manual_seed(2), biased=False)
    assert data.bayes_accuracy(x_k, x_v, label) > data.uniform_accuracy(x_v, label) + 0.1
    model = ProbeModel("quest", cfg.key_dim, cfg.num_values, linear_keys=True)
    assert isinstance(model.key_net, torch.nn.Linear)
    keys = model.keys(x_k).detach()
    rows = torch.arange(len(pos))
    answer, other = keys[rows, pos], keys[rows, (pos + 1) % cfg.seq_len]
    assert answer.norm(dim=-1).mean() > 1.5 * other.norm(dim=-1).mean()
    unit = torch.nn.functional.normalize
    assert (unit(answer, dim=-1).mean(0) - unit(other, dim=-1).mean(0)).norm() < 0.05


def test_every_variant_starts_at_the_same_inverse_temperature():
    """‖q‖ at init defaults to sqrt(head_dim), the value qknorm's scale g starts at."""
    from quest_spurious.task import SpuriousTask

    cfg = SpuriousTask().make_config("tiny", {})
    assert cfg.initial_query_norm == cfg.head_dim ** 0.5 == 4.0
    model = ProbeModel("qknorm", cfg.key_dim, cfg.num_values, cfg.head_dim, query_init_norm=cfg.initial_query_norm)
    gain = dict(model.kernel.named_parameters())["q_gain"]
    torch.testing.assert_close(model.query.norm(), gain.detach().reshape(()))
