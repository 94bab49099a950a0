"""Opt-in stability telemetry: query/key norms, max attention logit, attention entropy, per layer.

The paper's instability mechanism is coupled growth of ‖q‖ and ‖k‖: logits explode and attention entropy
collapses. ``Telemetry`` watches exactly that. It costs nothing when off (one ``is None`` check per call).
When on, the logits are recomputed from the transformed q and k in chunks of query rows, so memory stays
O(chunk × Lk) rather than O(Lq × Lk); ``max_queries`` subsamples query rows (evenly spaced) to bound the cost.

    with Telemetry(model) as tel:
        model(x)
    tel.snapshot()  # {"blocks.0.attn": {"q_norm_mean": ..., "k_norm_max": ..., "max_logit": ..., ...}, ...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from quest_core.functional import additive_mask

STAT_NAMES = ("q_norm_mean", "q_norm_max", "k_norm_mean", "k_norm_max", "max_logit", "entropy_mean")
_CHUNK_ELEMENTS = 1 << 22  # logits per chunk (16 MB in float32)


@torch.no_grad()
def attention_stats(
    q_raw: torch.Tensor,
    k_raw: torch.Tensor,
    q_bhld: torch.Tensor,
    k_bhld: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    max_queries: int | None = None,
) -> dict[str, float]:
    """Norms of the raw q, k; max logit and mean entropy of softmax(scale · q̂ k̂ᵀ + mask), for one call."""
    q_norm, k_norm = q_raw.float().norm(dim=-1), k_raw.float().norm(dim=-1)
    b, h, lq, _ = q_bhld.shape
    lk = k_bhld.shape[-2]
    if k_bhld.shape[1] != h:
        k_bhld = k_bhld.repeat_interleave(h // k_bhld.shape[1], dim=1)
    rows = torch.arange(lq, device=q_bhld.device)
    if max_queries is not None and lq > max_queries:
        rows = torch.linspace(0, lq - 1, max_queries, device=q_bhld.device).round().long()
    chunk = max(1, _CHUNK_ELEMENTS // max(1, b * h * lk))
    max_logit, entropy_sum, entropy_rows = -math.inf, 0.0, 0
    k_t = k_bhld.float().transpose(-2, -1)
    for start in range(0, len(rows), chunk):
        idx = rows[start : start + chunk]
        logits = (q_bhld[:, :, idx].float() @ k_t) * scale
        mask = _rows_of_mask(attn_mask, is_causal, idx, lq, lk, logits)
        if mask is not None:
            logits = logits + mask
        allowed = torch.isfinite(logits)
        if allowed.any():
            max_logit = max(max_logit, logits[allowed].max().item())
        probs = logits.softmax(dim=-1)
        entropy = -torch.where(probs > 0, probs * probs.clamp_min(1e-30).log(), torch.zeros_like(probs)).sum(-1)
        valid = allowed.any(dim=-1)  # skip fully masked rows
        entropy_sum += entropy[valid].sum().item()
        entropy_rows += int(valid.sum().item())
    return {
        "q_norm_mean": q_norm.mean().item(),
        "q_norm_max": q_norm.max().item(),
        "k_norm_mean": k_norm.mean().item(),
        "k_norm_max": k_norm.max().item(),
        "max_logit": max_logit,
        "entropy_mean": entropy_sum / max(1, entropy_rows),
    }


def _rows_of_mask(
    attn_mask: torch.Tensor | None, is_causal: bool, idx: torch.Tensor, lq: int, lk: int, logits: torch.Tensor
) -> torch.Tensor | None:
    """The additive mask restricted to the query rows ``idx``."""
    if is_causal:
        keep = torch.arange(lk, device=idx.device)[None, :] <= idx[:, None]
        return torch.zeros(keep.shape, dtype=logits.dtype, device=logits.device).masked_fill(~keep, float("-inf"))
    if attn_mask is None:
        return None
    mask = attn_mask if attn_mask.shape[-2] == 1 else attn_mask.index_select(-2, idx)
    return additive_mask(mask, False, len(idx), lk, logits.dtype, logits.device)


@dataclass
class LayerStats:
    """Statistics of one attention layer accumulated over calls since the last snapshot."""

    max_queries: int | None = 256
    sums: dict[str, float] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)
    calls: int = 0

    def update(self, stats: dict[str, float]) -> None:
        self.calls += 1
        for name, value in stats.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.maxes[name] = max(self.maxes.get(name, -math.inf), value)

    def pop(self) -> dict[str, float]:
        """Means over calls (maxima for the *_max and max_logit statistics), then reset."""
        out = {
            name: (self.maxes[name] if "max" in name else self.sums[name] / self.calls) for name in self.sums
        }
        self.sums, self.maxes, self.calls = {}, {}, 0
        return out


class Telemetry:
    """Attach stability statistics to every quest_core attention kernel in ``model`` (a context manager)."""

    def __init__(self, model: nn.Module, max_queries: int | None = 256):
        from quest_core.kernel import AttentionKernel

        self.layers = {
            name.removesuffix(".kernel") or "attention": module
            for name, module in model.named_modules()
            if isinstance(module, AttentionKernel)
        }
        if not self.layers:
            raise ValueError("no quest_core attention in this model: build it with quest_core or run swap_attention")
        self.max_queries = max_queries

    def __enter__(self) -> "Telemetry":
        for kernel in self.layers.values():
            kernel.telemetry = LayerStats(self.max_queries)
        return self

    def __exit__(self, *exc) -> None:
        for kernel in self.layers.values():
            kernel.telemetry = None

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per-layer statistics since the last snapshot (layers not called since are left out)."""
        return {
            name: kernel.telemetry.pop()
            for name, kernel in self.layers.items()
            if kernel.telemetry is not None and kernel.telemetry.calls
        }


def summarize(per_layer: dict[str, dict[str, float]]) -> dict[str, float]:
    """One row across layers: max of maxima, mean of means."""
    if not per_layer:
        return {}
    names = next(iter(per_layer.values())).keys()
    return {
        n: (max if "max" in n else (lambda xs: sum(xs) / len(xs)))([s[n] for s in per_layer.values()])
        for n in names
    }
