"""Opt-in stability telemetry: query/key norms, max attention logit, attention entropy, per layer.

The paper's instability mechanism is coupled growth of ‖q‖ and ‖k‖: logits explode and attention entropy
collapses. ``Telemetry`` watches exactly that. It costs nothing when off (one ``is None`` check per call).
When on, the logits are recomputed from the transformed q and k in chunks of query rows, so memory stays
O(chunk × Lk) rather than O(Lq × Lk): a chunk holds at most 2^22 logits (16 MiB in float32), and the statistics need
at most three such buffers at once (logits, probabilities, entropy terms), so telemetry adds at most ~48 MiB beyond
a copy of q and k in float32. ``max_queries`` subsamples query rows (evenly spaced) to bound the cost. Everything is
reduced on the device and read back once per call.

    with Telemetry(model) as tel:
        model(x)
    tel.snapshot()  # {"blocks.0.attn": {"q_norm_mean": ..., "k_norm_max": ..., "max_logit": ..., ...}, ...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from quest_core.functional import additive_mask, reduction_dtype

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
    """Norms of the raw q, k; max logit and mean entropy of softmax(scale · q̂ k̂ᵀ + mask), for one call.
    Fully masked query rows are left out of the entropy."""
    q_norm, k_norm = _row_norms(q_raw), _row_norms(k_raw)
    b, h, lq, _ = q_bhld.shape
    lk = k_bhld.shape[-2]
    if k_bhld.shape[1] != h:
        k_bhld = k_bhld.repeat_interleave(h // k_bhld.shape[1], dim=1)
    rows = None  # all query rows, taken as slices (no index tensors, no copies)
    if max_queries is not None and lq > max_queries:
        rows = torch.linspace(0, lq - 1, max_queries, device=q_bhld.device).round().long()
    n_rows = lq if rows is None else len(rows)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, b * h * lk))
    k_t = k_bhld.float().transpose(-2, -1)
    max_logit = torch.full((), -math.inf, device=q_bhld.device)
    entropy_sum = torch.zeros((), device=q_bhld.device)
    entropy_rows = torch.zeros((), device=q_bhld.device)
    for start in range(0, n_rows, chunk):
        stop = min(n_rows, start + chunk)
        idx = torch.arange(start, stop, device=q_bhld.device) if rows is None else rows[start:stop]
        q_rows = q_bhld[:, :, start:stop] if rows is None else q_bhld[:, :, idx]
        logits = (q_rows.float() @ k_t).mul_(scale)
        mask = _rows_of_mask(attn_mask, is_causal, idx, lq, lk, logits)
        if mask is not None:
            logits.add_(mask)
        row_max = logits.amax(dim=-1)
        max_logit = torch.maximum(max_logit, row_max.amax())
        valid = row_max > -math.inf  # rows with at least one allowed key
        probs = logits.softmax(dim=-1)
        del logits
        entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)
        entropy_sum += entropy.masked_fill(~valid, 0.0).sum()
        entropy_rows += valid.sum()
    stats = torch.stack([q_norm.mean(), q_norm.amax(), k_norm.mean(), k_norm.amax(), max_logit,
                         entropy_sum / entropy_rows.clamp_min(1)]).tolist()
    return dict(zip(STAT_NAMES, stats))


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norms over the last dim, reduced in float32 (float64 for float64 inputs) without a converted copy."""
    return torch.linalg.vector_norm(x, dim=-1, dtype=reduction_dtype(x))


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
