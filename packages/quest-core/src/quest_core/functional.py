"""Functional attention: a (q, k) transform followed by one fused SDPA call with an explicit scale.

Layout and mask semantics are those of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); a boolean ``attn_mask`` is True where attention is
allowed, a float mask is added to the logits; ``is_causal`` masks the upper triangle (top-left aligned).
Fewer key/value heads than query heads (Hq % Hkv == 0) is grouped-query attention.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F

from quest_core.variants import Side, Variant, get_variant, list_variants

NORM_EPS = 1e-6  # an all-zero vector normalises to zero instead of NaN


def reduction_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype norms and statistics are reduced in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)`` that returns a new tensor only when the dtype changes. Inside an autograd.Function's forward,
    an output that is a no-op ``.to`` of a tensor, or that was made by an in-place op, makes torch.compile (eager,
    aot_eager and inductor backends, torch 2.11) return an all-zero input gradient; ``test_compile.py`` guards
    against both."""
    return x if x.dtype == dtype else x.to(dtype)


class _ScaledL2Normalize(torch.autograd.Function):
    """y = γ ⊙ x ⋅ inv over the last dim, inv = 1 / max(‖x‖, eps) given per row (computed without grad by the
    caller), with an optional gain γ (shape (1,), (H, 1, 1) or (D,)).

    Memory: saves the raw x (alive anyway: it is the projection's output, or a view of a fused qkv buffer), the
    per-row ``inv`` (4 bytes a row) and γ; the normalised tensor is never saved here (``sdpa`` recomputes it for
    SDPA's backward as well, see ``RecomputeSaved``). No host sync, whatever γ holds.
    Gradients: with u = x ⋅ inv and h = γ ⊙ g, dx = (h − u (h·u)) ⋅ inv where ‖x‖ > eps, and h / eps where the clamp
    is active (y is linear in x there); dγ = Σ g ⊙ u over the dims γ broadcasts along. Half-precision inputs keep
    their dtype in backward (the row dot product is reduced in float32): no float32 tensor the size of x.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, inv: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
        ctx.eps = eps
        ctx.save_for_backward(x, inv, gain)
        return scale_rows(x, inv, gain)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, inv, gain = ctx.saved_tensors
        work = torch.float32 if x.dtype == torch.float16 else x.dtype  # float16: 1/‖x‖ may overflow its range
        x_w, inv_w = x.to(work), inv.to(work)
        h = g.to(work) if gain is None else g.to(work) * gain.to(work)
        hu = (h * x_w).sum(-1, keepdim=True, dtype=inv.dtype).mul_(inv)  # h·u, reduced in float32 (float64)
        clamped = inv >= torch.full((), ctx.eps, dtype=inv.dtype, device=inv.device).reciprocal()  # as computed
        coeff = hu.masked_fill_(clamped, 0.0).mul_(inv).mul_(inv).neg_()  # y = γ x / eps there: no projection
        dx = cast((h * inv_w).addcmul_(x_w, coeff.to(work)), x.dtype)  # h/‖x‖ − x (h·u)/‖x‖²: one x-sized tensor
        dgain = None
        if gain is not None and ctx.needs_input_grad[2]:
            dgain = cast((g.to(work) * x_w).mul_(inv_w).sum_to_size(gain.shape), gain.dtype)
        return dx, None, dgain, None


def inverse_norm(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """1 / max(‖x‖, eps) over the last dim, (..., 1), in float32 (float64 for float64 inputs), without grad."""
    with torch.no_grad():
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=reduction_dtype(x))
        return norm.clamp_min_(eps).reciprocal_()


def scale_rows(x: torch.Tensor, inv: torch.Tensor, gain: torch.Tensor | None) -> torch.Tensor:
    """γ ⊙ x ⋅ inv in x's dtype: the forward of ``l2_normalize`` (also its recomputation, bit for bit)."""
    factor = inv if gain is None else inv * gain.to(inv.dtype)
    if x.dtype == torch.bfloat16:  # one pass in bfloat16 (float32's range), no float32 copy of x
        return x * factor.to(x.dtype)
    return cast(x.to(factor.dtype) * factor, x.dtype)  # float32/float64 as they are; float16 through float32


def l2_normalize(x: torch.Tensor, eps: float = NORM_EPS, *, gain: torch.Tensor | None = None) -> torch.Tensor:
    """γ ⊙ x / max(‖x‖, eps) over the last dim (γ = 1 without ``gain``), in x's dtype; the norm in float32."""
    return _ScaledL2Normalize.apply(x, inverse_norm(x, eps), gain, eps)


def layer_norm_stats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1/std) over the last dim, (..., 1) each, in float32 (float64 for float64 inputs), without grad."""
    with torch.no_grad():
        var, mean = torch.var_mean(x.to(reduction_dtype(x)), dim=-1, keepdim=True, correction=0)
        return mean, (var + eps).rsqrt_()


def normalize_rows(x, mean, rstd, weight, bias) -> torch.Tensor:
    """γ ⊙ (x − mean) ⋅ rstd + β in x's dtype: the forward of ``layer_norm`` (also its recomputation, bit for bit)."""
    x_hat = (x.to(rstd.dtype) - mean) * rstd  # out of place: torch.compile mishandles a Function output made in place
    return cast(x_hat * weight.to(rstd.dtype) + bias.to(rstd.dtype), x.dtype)


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dim from given (mean, rstd) that saves the raw x (a view of the qkv buffer, alive
    anyway, never made contiguous), the per-row statistics and γ, β; torch's layer_norm would save a contiguous
    copy of a strided x. Gradients: x̂ = (x − mean) rstd, h = γ ⊙ g, dx = (h − mean(h) − x̂ mean(h ⊙ x̂)) rstd,
    dγ = Σ g ⊙ x̂, dβ = Σ g."""

    @staticmethod
    def forward(ctx, x, mean, rstd, weight, bias):
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return normalize_rows(x, mean, rstd, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        work = x.dtype if x.dtype in (torch.bfloat16, torch.float64) else torch.float32  # no float32 copy of bf16 x
        x_hat = (x.to(work) - mean.to(work)).mul_(rstd.to(work))
        h = g.to(work) * weight.to(work)
        h_mean = h.mean(-1, keepdim=True, dtype=rstd.dtype)  # row means reduced in float32 (float64)
        hx_mean = (h * x_hat).mean(-1, keepdim=True, dtype=rstd.dtype)
        dx = h.sub_(h_mean.to(work)).sub_(x_hat * hx_mean.to(work)).mul_(rstd.to(work))  # h is a new tensor here
        dw = cast((g.to(work) * x_hat).sum_to_size(weight.shape), weight.dtype) if ctx.needs_input_grad[3] else None
        db = cast(g.sum_to_size(bias.shape), bias.dtype) if ctx.needs_input_grad[4] else None
        return cast(dx, x.dtype), None, None, dw, db


class RecomputeSaved:
    """Saved-tensor hooks that keep SDPA from storing the transformed q̂/k̂: when autograd saves one of them, it
    keeps a recipe instead (the raw tensor, alive anyway, and its few per-row factors) and recomputes the tensor
    bit for bit when SDPA's backward asks for it. Memory: what SDPA alone keeps, plus per-row factors.

    Saved-tensor hooks already active around the call (activation offloading, ``quest_core.saved_bytes``) still
    see what is kept: the raw tensor of a recipe, every other tensor as it is. A raw tensor modified in place
    between forward and backward is an error, as autograd reports it elsewhere. Not used under ``torch.compile``:
    there the compiler's partitioner decides what to save and what to recompute.
    """

    def __init__(self):
        self.recipes: list[tuple[torch.Tensor, torch.Tensor, object]] = []  # (output, raw input, recompute(raw))
        self.outer = None  # the (pack, unpack) hooks active around this call, if any

    def add(self, out: torch.Tensor, raw: torch.Tensor, recompute) -> torch.Tensor:
        """Register ``out`` = ``recompute(raw)``; returns ``out``. A ``raw`` that is itself a registered output is
        replaced by its own raw input, composing the recipes (the metric, then the normalisation)."""
        if out.requires_grad and not torch.compiler.is_compiling():
            for earlier_out, earlier_raw, earlier_recompute in self.recipes:
                if raw is earlier_out:
                    raw, recompute = earlier_raw, _compose(earlier_recompute, recompute)
                    break
            self.recipes.append((out, raw, recompute))
        return out

    def pack(self, t: torch.Tensor):
        outer_pack = self.outer[0] if self.outer else (lambda x: x)
        for out, raw, recompute in self.recipes:
            if t is out:
                return _Recipe(outer_pack(raw), raw._version, recompute)
        return _Kept(outer_pack(t))

    def unpack(self, packed):
        raw = self.outer[1](packed.value) if self.outer else packed.value
        if not isinstance(packed, _Recipe):
            return raw
        if raw._version != packed.version and not self.outer:
            raise RuntimeError("a q or k tensor of a quest_core attention call was modified in place between forward "
                               "and backward; clone it before modifying it")
        with torch.no_grad():
            return packed.recompute(raw)

    @contextlib.contextmanager
    def hooks(self):
        """The context, around the transform and the attention call, that applies the recipes (registered inside
        it) to whatever autograd saves there. On exit the recipes' outputs are released (autograd keeps the hooks,
        and with them this object, alive until backward)."""
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            yield
            return
        self.outer = torch._C._autograd._top_saved_tensors_default_hooks(False)  # torch has no public getter
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.recipes.clear()


def _compose(first, second):
    return lambda raw: second(first(raw))


class _Kept(NamedTuple):
    value: object  # the saved tensor (or what the outer hooks made of it)


class _Recipe(NamedTuple):
    value: object  # the raw tensor (or what the outer hooks made of it)
    version: int
    recompute: object  # raw -> the transformed tensor, bit for bit


LAYER_NORM_EPS = 1e-6


def transform_side(side: Side, x: torch.Tensor, params: dict[str, torch.Tensor],
                   saved: RecomputeSaved | None = None) -> torch.Tensor:
    """One side (q or k) of a variant: apply the metric, normalise, scale by the (mapped) gain, add the bias (see
    ``Side``); ``params`` holds the variant's parameters by name and, for metric variants, ``"metric"``. With
    ``saved``, the result is registered for recomputation in backward instead of being stored."""
    saved = saved or RecomputeSaved()
    if side.metric:  # (..., H_kv, 1, D), repeated to the query heads under grouped-query attention
        metric = params["metric"]
        if metric.shape[-3] != x.shape[-3]:
            metric = metric.repeat_interleave(x.shape[-3] // metric.shape[-3], dim=-3)
        metric = metric.to(x.dtype)
        x = saved.add(x * metric, x, lambda raw: raw * metric)
    gain = params[side.gain] if side.gain else None
    if gain is not None and side.gain_fn is not None:
        gain = side.gain_fn(gain)
    if side.norm == "l2":
        inv = inverse_norm(x)
        y = _ScaledL2Normalize.apply(x, inv, gain, NORM_EPS)
        return saved.add(y, x, lambda raw: scale_rows(raw, inv, gain))
    if side.norm == "layernorm":
        ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        weight = gain if gain is not None else ones
        bias = params[side.bias] if side.bias else torch.zeros_like(ones)
        mean, rstd = layer_norm_stats(x, LAYER_NORM_EPS)
        y = _LayerNorm.apply(x, mean, rstd, weight, bias)
        return saved.add(y, x, lambda raw: normalize_rows(raw, mean, rstd, weight, bias))
    return x if gain is None else x * gain.to(x.dtype)


def transform_qk(
    spec: Variant, q_bhld: torch.Tensor, k_bhld: torch.Tensor, params: dict[str, torch.Tensor] | None = None,
    saved: RecomputeSaved | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a variant's transforms (its declaration's ``q`` and ``k`` sides) with its parameters ``params`` (by
    name, broadcast against (..., H, L, D)). Gains are folded into the normalisation. Pass ``saved`` and run this
    and the attention call inside ``saved.hooks()`` to recompute q̂, k̂ in backward instead of storing them."""
    params = params or {}
    return transform_side(spec.q, q_bhld, params, saved), transform_side(spec.k, k_bhld, params, saved)


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
    enable_gqa: bool = True,
) -> None:
    """Raise a ValueError/TypeError that says what is wrong and what is valid.

    Shapes as in ``F.scaled_dot_product_attention``: q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv), at least 2
    dims, whose leading dims broadcast against each other (a batch of 1 in k/v serves every query batch); with
    ``enable_gqa``, k/v may instead have fewer heads (dim -3) than q, a divisor of them (grouped-query attention).
    """
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., length, head_dim); got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"query, key, value must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    (lq, d), (lk, dk), (lv, _) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if d != dk:
        raise ValueError(f"query and key head dims differ: {d} vs {dk}")
    if lk != lv:
        raise ValueError(f"key and value must have the same length; got key {tuple(k.shape)}, value {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"key {tuple(k.shape)} and value {tuple(v.shape)} leading dims do not broadcast") from None
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        hq, hk = (q.shape[-3] if q.dim() > 2 else 1), (k.shape[-3] if k.dim() > 2 else 1)
        if hq == hk or min(q.dim(), k.dim()) < 3:
            raise ValueError(f"leading (batch, head) dims do not broadcast: query {tuple(q.shape)}, key "
                             f"{tuple(k.shape)}, value {tuple(v.shape)}") from None
        if hq % hk != 0:
            raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for grouped-query "
                             "attention") from None
        if not enable_gqa:
            raise ValueError(f"query has {hq} heads but key/value have {hk}: pass enable_gqa=True for grouped-query "
                             "attention (as in F.scaled_dot_product_attention)") from None
        batch = (*torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]), hq)
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be bool (True = attend) or floating (added to logits), got {attn_mask.dtype}")
        target = (*batch, lq, lk)
        try:
            torch.broadcast_shapes(attn_mask.shape, target)
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (..., Lq, Lk) = {target}"
            ) from None


def with_causal(attn_mask: torch.Tensor, lq: int, lk: int) -> torch.Tensor:
    """``attn_mask`` (bool True = attend, or float added to logits) with the causal (top-left) mask folded in."""
    keep = torch.ones(lq, lk, dtype=torch.bool, device=attn_mask.device).tril()
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf"))


def sdpa(
    q_bhld: torch.Tensor,
    k_bhld: torch.Tensor,
    v_bhld: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """One fused SDPA call with an explicit scale. Masks pass through unchanged (a float mask keeps its precision,
    as in torch); a mask together with ``is_causal`` applies both (folded into one mask: torch's fused CPU kernel
    does the same, its other paths refuse the pair); grouped-query attention is on when the head counts differ."""
    if attn_mask is not None and is_causal:
        attn_mask, is_causal = with_causal(attn_mask, q_bhld.shape[-2], k_bhld.shape[-2]), False
    enable_gqa = q_bhld.dim() > 2 and k_bhld.dim() > 2 and q_bhld.shape[-3] != k_bhld.shape[-3] != 1
    return F.scaled_dot_product_attention(
        q_bhld, k_bhld, v_bhld, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa,
    )


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    variant: str = "quest",
) -> torch.Tensor:
    """Attention with a parameter-free variant: ``F.scaled_dot_product_attention``'s signature and semantics
    (any leading dims, bool or float masks, causal, grouped-query attention only with ``enable_gqa``) plus
    ``variant=``.

    ``scale=None`` is the variant's own default (1/sqrt(D) for softmax, 1 for quest and qnorm). Variants with
    learnable parameters own them: use ``quest_core.AttentionKernel`` or the modules built on it.
    """
    spec = get_variant(variant)
    if not spec.is_parameter_free:
        functional = [name for name in list_variants() if get_variant(name).is_parameter_free]
        raise ValueError(
            f"variant {spec.name!r} has learnable parameters or state, so it is a module: use "
            "quest_core.AttentionKernel, "
            f"quest_core.SelfAttention or quest_core.MultiheadAttention (functional variants: {', '.join(functional)})"
        )
    check_inputs(query, key, value, attn_mask, is_causal, enable_gqa)
    saved = RecomputeSaved()
    with saved.hooks():
        query, key = transform_qk(spec, query, key, saved=saved)
        scale = spec.default_scale(query.shape[-1]) if scale is None else scale
        return sdpa(query, key, value, scale, attn_mask, is_causal, dropout_p)


def additive_mask(
    attn_mask: torch.Tensor | None, is_causal: bool, lq: int, lk: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """The SDPA mask (bool True = attend, or float) and causal flag as one additive float mask, or None."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = torch.zeros(attn_mask.shape, dtype=dtype, device=device).masked_fill(~attn_mask, float("-inf"))
        else:
            mask = attn_mask.to(dtype)
    if is_causal:  # together with a mask, as torch's SDPA does: both apply
        keep = torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
        causal = torch.zeros(lq, lk, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
        mask = causal if mask is None else mask + causal
    return mask


def attention_probs(
    q_bhld: torch.Tensor,
    k_bhld: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """The (..., H, Lq, Lk) attention matrix of already-transformed q and k (materialised: for need_weights).

    Logits are computed in float32 for half-precision inputs (scale applied before the product can overflow);
    the probabilities come back in the input dtype. A row whose every key is masked gets zeros, as the fused
    kernel's output does, not NaN.
    """
    if k_bhld.shape[-3] != q_bhld.shape[-3]:
        k_bhld = k_bhld.repeat_interleave(q_bhld.shape[-3] // k_bhld.shape[-3], dim=-3)
    compute = reduction_dtype(q_bhld)
    logits = (q_bhld.to(compute) * scale) @ k_bhld.to(compute).transpose(-2, -1)
    mask = additive_mask(attn_mask, is_causal, q_bhld.shape[-2], k_bhld.shape[-2], logits.dtype, logits.device)
    if mask is not None:
        logits = logits + mask
    probs = logits.softmax(dim=-1)
    if mask is not None:
        probs = probs.masked_fill(torch.isneginf(logits.amax(dim=-1, keepdim=True)), 0.0)
    return probs.to(q_bhld.dtype)
