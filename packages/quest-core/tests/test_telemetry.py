"""Telemetry: exact against a materialised computation, chunked and sampled, off by default."""

import math

import pytest
import torch

import quest_core as qc
from quest_core.telemetry import attention_stats


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def direct_stats(q, k, scale, keep=None):
    logits = scale * q @ k.transpose(-2, -1)
    if keep is not None:
        logits = logits.masked_fill(~keep, -math.inf)
    p = logits.softmax(-1)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    return logits.max().item(), entropy.mean().item()


@pytest.mark.parametrize("causal", [False, True])
def test_stats_match_a_direct_computation(causal, monkeypatch):
    monkeypatch.setattr("quest_core.telemetry._CHUNK_ELEMENTS", 7 * 2 * 3 * 11)  # force several chunks
    q, k = rand(2, 3, 11, 8, seed=1) * 3, rand(2, 3, 11, 8, seed=2)
    keep = torch.ones(11, 11, dtype=torch.bool).tril() if causal else None
    stats = attention_stats(q, k, q, k, 0.5, is_causal=causal)
    max_logit, entropy = direct_stats(q, k, 0.5, keep)
    assert stats["max_logit"] == pytest.approx(max_logit)
    assert stats["entropy_mean"] == pytest.approx(entropy)
    assert stats["k_norm_max"] == pytest.approx(k.norm(dim=-1).max().item())
    assert stats["q_norm_mean"] == pytest.approx(q.norm(dim=-1).mean().item())


def test_padding_mask_and_sampling():
    q, k = rand(2, 2, 40, 4, seed=3), rand(2, 2, 40, 4, seed=4)
    keep = (torch.arange(40) < 25)[None, None, None, :]
    exact = attention_stats(q, k, q, k, 1.0, attn_mask=keep)
    assert exact["max_logit"] == pytest.approx(direct_stats(q, k, 1.0, keep)[0])
    sampled = attention_stats(q, k, q, k, 1.0, attn_mask=keep, max_queries=10)
    assert sampled["max_logit"] <= exact["max_logit"]
    assert sampled["entropy_mean"] == pytest.approx(exact["entropy_mean"], rel=0.2)


def test_telemetry_context_per_layer_and_off_by_default():
    torch.manual_seed(0)
    model = torch.nn.Sequential(qc.SelfAttention(16, 2, "quest"), qc.SelfAttention(16, 2, "softmax"))
    x = torch.randn(2, 9, 16)
    assert all(m.kernel.telemetry is None for m in model)
    with qc.Telemetry(model) as tel:
        model(x)
        model(x)
        snap = tel.snapshot()
        assert tel.snapshot() == {}  # reset after a snapshot
    assert set(snap) == {"0", "1"} and set(snap["0"]) == set(qc.telemetry.STAT_NAMES)
    assert all(m.kernel.telemetry is None for m in model)
    assert snap["0"]["entropy_mean"] <= math.log(9) + 1e-6
    assert qc.summarize(snap)["max_logit"] == max(snap["0"]["max_logit"], snap["1"]["max_logit"])
    with pytest.raises(ValueError, match="no quest_core attention"):
        qc.Telemetry(torch.nn.Linear(2, 2))
