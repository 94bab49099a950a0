"""The state the elliptical variants carry between attention layers: the metric M = diag(m) of Elliptical Attention
(Nielsen et al. 2024), estimated from the values of consecutive layers.

Elliptical Attention replaces q·k by q^T M k, M = diag(m), where m_d measures how much the function the network
computes changes along coordinate d; the paper estimates it without parameters from the values of two consecutive
layers: m_d ∝ mean over tokens of |v^ℓ_d − v^{ℓ−1}_d|. What the paper leaves open, and what we chose:

- **Granularity**: one m per sequence and head (over that head's dims), averaged over the sequence's tokens that
  some query can see (padding excluded), so a sequence's output does not depend on its batch or its padding. The
  estimate is reduced in float32, or float64 for float64 values.
- **Normalisation**: m / max_d(m) per head, so m ∈ (0, 1] and the largest coordinate keeps the dot product's scale;
  a floor of 1e-6 keeps every coordinate (a zero would drop a dim from the logits entirely).
- **The first layer**, and any layer whose previous layer's values have another shape (a hierarchical model's next
  stage, a cross-attention with another length) or whose values have another width than its queries and keys
  (the metric lives on the q·k coordinates and is read off the values, so the two must match), has no estimate:
  it uses M = I (plain dot product; for ``elliptical-quest``, QUEST).
- **Gradients**: the estimate is a statistic of the forward pass, detached (no gradient flows through M).
- **Consecutive** means consecutive in call order within one forward of the model: ``link_elliptical(model)`` puts
  every kernel of the model on one ``MetricChain`` and restarts it at each forward of ``model``.
- **Causal attention** (``is_causal=True``): an average over all tokens would let each token see a statistic of the
  tokens after it, so a causal call uses the estimate of that layer's previous *training* call, averaged over its
  batch (M = I before the first), like BatchNorm's running statistics, and evaluation uses the last training estimate: nothing of a
  sequence's future reaches its past. (Causality given only as an ``attn_mask`` is not detected: pass
  ``is_causal=True``.)

The QUEST form (``elliptical-quest``) normalises keys in the metric: k / ‖k‖_M with ‖k‖_M² = k^T M k, scale 1.
Both are implemented as q̂ = s ⊙ q, k̂ = s ⊙ k (then normalised for the QUEST form), s = sqrt(m).
"""

from __future__ import annotations

import torch
from torch import nn

METRIC_FLOOR = 1e-6


class MetricChain:
    """The previous elliptical layer's values within the current forward of a model (see the module docstring)."""

    def __init__(self):
        self.previous_v: torch.Tensor | None = None

    def restart(self) -> None:
        self.previous_v = None

    @torch.no_grad()
    def next_metric(self, v_bhld: torch.Tensor, head_dim: int, visible_bhl1: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """sqrt(m) for the layer whose values are ``v_bhld`` (..., H, L, Dv) and whose q, k have ``head_dim``
        coordinates, shaped (..., H, 1, head_dim) in v's reduction dtype (float64 for float64 values); then
        remember v. ``visible_bhl1`` (broadcastable to (..., H, L, 1)) weights each key: 0 for keys no query can
        see (padding), which then do not enter the average."""
        previous, self.previous_v = self.previous_v, v_bhld.detach()
        compute = torch.float64 if v_bhld.dtype == torch.float64 else torch.float32
        identity = torch.ones(*v_bhld.shape[:-2], 1, head_dim, dtype=compute, device=v_bhld.device)
        if previous is None or previous.shape != v_bhld.shape or v_bhld.shape[-1] != head_dim:
            return identity  # no estimate: M = I
        change = (v_bhld.to(compute) - previous.to(compute)).abs()
        weight = torch.ones_like(change[..., :1]) if visible_bhl1 is None else visible_bhl1.to(compute)
        m = (change * weight).sum(-2) / (weight.sum(-2).clamp_min(1.0))  # (..., H, D): mean over visible keys
        top = m.amax(dim=-1, keepdim=True)
        m = torch.where(top > 0, m / top.clamp_min(torch.finfo(compute).tiny), torch.ones_like(m))  # unchanged
        return m.clamp_min(METRIC_FLOOR).sqrt().unsqueeze(-2)  # values: no estimate, M = I


def visible_keys(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(..., Lk, 1) bool: keys at least one query may attend to under ``attn_mask`` (bool True = attend, or float
    added to the logits); None when there is no mask (every key is visible)."""
    if attn_mask is None:
        return None
    allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask != float("-inf")
    return allowed.any(dim=-2).unsqueeze(-1)


def _restart_chain(model: nn.Module, args) -> None:
    """Forward pre-hook of a linked model (a module-level function, so that the model still pickles and deep-copies:
    the hook finds the chain on the model it runs for)."""
    model._quest_metric_chain.restart()


def link_elliptical(model: nn.Module) -> MetricChain | None:
    """Put every elliptical kernel of ``model`` on one metric chain that restarts at each forward of ``model``
    (idempotent; returns the chain, or None if the model has no elliptical kernel). ``swap_attention`` calls it;
    call it yourself on a model built with elliptical variants."""
    from quest_core.kernel import AttentionKernel

    kernels = [m for m in model.modules() if isinstance(m, AttentionKernel) and m.spec.uses_metric]
    if not kernels:
        return None
    chain = getattr(model, "_quest_metric_chain", None)
    if chain is None:
        chain = MetricChain()
        model._quest_metric_chain = chain
        model.register_forward_pre_hook(_restart_chain)
    for kernel in kernels:
        kernel.metric_chain = chain
    return chain
