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
- **Consecutive** means consecutive in call order within one pass through the model. No wiring is needed: at its
  first call, an elliptical kernel links the model it runs in (the outermost module with a method running, e.g.
  the whole network, or a DDP wrapper around it) with ``link_elliptical``, which puts every elliptical kernel of
  that model on one ``MetricChain`` and restarts it at each forward of the model. A pass through another method
  (``model.logits(x)``) restarts it when a kernel already called in the pass is called again, so a model that
  calls one kernel twice per pass (shared weights) must enter through ``forward``. ``swap_attention`` links at
  once; call ``link_elliptical(model)`` yourself only to choose another module as the model (e.g. after a block's
  kernel was first called on its own).
- **Activation checkpointing** (``torch.utils.checkpoint``, reentrant or not): a forward recomputed in backward
  uses the metric its original forward used (each kernel keeps the metrics of the model's latest forward), so
  the gradients equal those without checkpointing. Backward must follow the forward it differentiates before the
  model's next forward (as in any training loop); a kernel called more than once per forward cannot tell which of
  its calls is recomputed and raises an error instead.
- **Causal attention** (``is_causal=True``): an average over all tokens would let each token see a statistic of the
  tokens after it, so a causal call uses the estimate of that layer's previous *training* call, averaged over its
  batch (M = I before the first), like BatchNorm's running statistics, and evaluation uses the last training estimate: nothing of a
  sequence's future reaches its past. (Causality given only as an ``attn_mask`` is not detected: pass
  ``is_causal=True``.)

The QUEST form (``elliptical-quest``) normalises keys in the metric: k / ‖k‖_M with ‖k‖_M² = k^T M k, scale 1.
Both are implemented as q̂ = s ⊙ q, k̂ = s ⊙ k (then normalised for the QUEST form), s = sqrt(m).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

METRIC_FLOOR = 1e-6


class MetricChain:
    """The previous elliptical layer's values within the current forward of a model (see the module docstring)."""

    def __init__(self):
        self.previous_v: torch.Tensor | None = None
        self.generation = 0  # counts the model's passes: a kernel's recorded metrics belong to one of them
        self.called: set[int] = set()  # the kernels (ids) called in the current pass
        self.in_forward = False  # while the model's forward runs (its hooks restart the chain)
        self.linking_frame = None  # the model's forward call during which it was linked (its hooks did not run)

    def restart(self) -> None:
        self.previous_v = None
        self.generation += 1
        self.called = set()

    def enter(self, kernel: nn.Module) -> None:
        """A kernel's call begins. Outside the model's forward (a pass through another method of the model, e.g.
        ``model.logits(x)``), a kernel called again starts a new pass."""
        if self.linking_frame is not None and not on_stack(self.linking_frame):  # that first forward has ended
            self.linking_frame, self.in_forward = None, False
        if not self.in_forward and id(kernel) in self.called:
            self.restart()
        self.called.add(id(kernel))

    def __getstate__(self) -> dict:
        return {"generation": self.generation}  # a copy starts between passes (and holds no frame)

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.generation = state.get("generation", 0)

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
    chain = model._quest_metric_chain
    chain.restart()
    chain.in_forward, chain.linking_frame = True, None


def _end_forward(model: nn.Module, args, output) -> None:
    """Forward hook of a linked model (always called, also when the forward raises)."""
    model._quest_metric_chain.in_forward = False


def on_stack(frame) -> bool:
    """Whether ``frame`` is running in this thread (is on its call stack)."""
    current = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


def link_elliptical(model: nn.Module) -> MetricChain | None:
    """Put every elliptical kernel of ``model`` on one metric chain that restarts at each forward of ``model``
    (idempotent; returns the chain, or None if the model has no elliptical kernel). Kernels do this themselves at
    their first call (``link_running_model``) and ``swap_attention`` calls it; call it to pick the model yourself."""
    from quest_core.kernel import AttentionKernel

    kernels = [m for m in model.modules() if isinstance(m, AttentionKernel) and m.spec.uses_metric]
    if not kernels:
        return None
    chain = getattr(model, "_quest_metric_chain", None)
    if chain is None:
        chain = MetricChain()
        model._quest_metric_chain = chain
        model.register_forward_pre_hook(_restart_chain)
        model.register_forward_hook(_end_forward, always_call=True)
    for kernel in kernels:
        kernel.metric_chain = chain
    return chain


def running_model(kernel: nn.Module) -> nn.Module | None:
    """The outermost module running in this thread (its forward, or another method such as ``model.logits``) that
    contains ``kernel``: the kernel itself when it is called on its own; None when no module method is running."""
    frame, outermost = sys._getframe(1), None
    while frame is not None:
        if "self" in frame.f_code.co_varnames[:1]:
            module = frame.f_locals.get("self")
            if module is kernel or (isinstance(module, nn.Module) and any(m is kernel for m in module.modules())):
                outermost = module
        frame = frame.f_back
    return outermost


@torch.compiler.disable
def link_running_model(kernel: nn.Module) -> MetricChain:
    """Link the model ``kernel`` is running in (``running_model``; the kernel itself when called on its own) and
    return the kernel's chain: what an elliptical kernel does at its first call, so that models need no wiring."""
    model = running_model(kernel) or kernel
    fresh = getattr(model, "_quest_metric_chain", None) is None
    chain = link_elliptical(model)
    call = nn.Module._call_impl.__code__
    frame = sys._getframe(1)
    while fresh and frame is not None:  # linked inside the model's forward: its hooks start with the next one
        if frame.f_code is call and frame.f_locals.get("self") is model:
            chain.in_forward, chain.linking_frame = True, frame
        frame = frame.f_back
    return chain


def in_recomputation() -> bool:
    """Whether this forward runs inside a backward pass: the recomputation of activation checkpointing (never while
    torch.compile traces)."""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1
