"""Functional attention: a (q, k) transform followed by one fused SDPA call with an explicit scale.

Layout and mask semantics are those of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); a boolean ``attn_mask`` is True where attention is
allowed, a float mask is added to the logits; ``is_causal`` masks the upper triangle (top-left aligned).
Fewer key/value heads than query heads (Hq % Hkv == 0) is grouped-query attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quest_core.variants import Side, Variant, get_variant, list_variants

NORM_EPS = 1e-6  # an all-zero vector normalises to zero instead of NaN


def reduction_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype norms and statistics are reduced in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _ScaledL2Normalize(torch.autograd.Function):
    """y = γ ⊙ x / max(‖x‖, eps) over the last dim, with an optional gain γ (shape (1,), (H, 1, 1) or (D,)).

    Memory: the norm is reduced in float32 (float64 for float64 inputs), but y is returned in x's dtype and is the
    only full-size tensor saved: it is also the tensor the fused attention kernel saves, so the two share storage.
    Backward recovers x/‖x‖ = y / γ from it and the saved per-row inverse norm (4 bytes a row), instead of keeping
    x, x/‖x‖ or a float32 copy. (A gain with an exact zero would lose x/‖x‖ there: then x/‖x‖ is saved as well.)
    Gradients: with u = x/‖x‖ and h = γ ⊙ g, dx = (h − u (h·u)) / ‖x‖ (just h/eps where ‖x‖ ≤ eps, where y is
    linear in x), dγ = Σ g ⊙ u over the dims γ broadcasts along.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, gain: torch.Tensor | None, eps: float, gain_may_be_zero: bool = True
                ) -> torch.Tensor:
        ctx.gain_may_be_zero = gain_may_be_zero
        compute = reduction_dtype(x)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=compute)
        active = norm > eps  # where the clamp is active, y = γ x / eps is linear in x
        inv = norm.clamp_min_(eps).reciprocal_()
        factor = inv if gain is None else inv * gain.to(compute)
        if x.dtype == torch.bfloat16:  # one pass in bfloat16 (float32's range), no float32 copy of x
            y = x * factor.to(x.dtype)
        else:  # float32/float64 as they are; float16 through float32, where 1/‖x‖ of a tiny row cannot overflow
            y = (x.to(compute) * factor).to(x.dtype)
        keep_u = gain is not None and ctx.gain_may_be_zero and bool((gain == 0).any())  # a sync: only if needed
        u = (x.to(compute) * inv).to(x.dtype) if keep_u else None
        ctx.save_for_backward(y, inv, active, gain, u)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, inv, active, gain, u = ctx.saved_tensors
        compute = inv.dtype
        g = g.to(compute)
        if gain is None:
            u, h = y.to(compute), g
        else:
            gain_c = gain.to(compute)
            u = u.to(compute) if u is not None else y.to(compute) / gain_c
            h = g * gain_c
        dot = (h.unsqueeze(-2) @ u.unsqueeze(-1)).squeeze(-1) * active  # (..., 1), no (..., D) temporary
        dx = (u * dot.neg_()).add_(h).mul_(inv).to(y.dtype)
        dgain = (g * u).sum_to_size(gain.shape).to(gain.dtype) if gain is not None and ctx.needs_input_grad[1] else None
        return dx, dgain, None, None


def l2_normalize(x: torch.Tensor, eps: float = NORM_EPS, *, gain: torch.Tensor | None = None,
                 gain_may_be_zero: bool = True) -> torch.Tensor:
    """γ ⊙ x / max(‖x‖, eps) over the last dim (γ = 1 without ``gain``), in x's dtype; the norm in float32.
    ``gain_may_be_zero=False`` (a gain positive by construction) skips the zero check, a host sync on GPUs."""
    return _ScaledL2Normalize.apply(x, gain, eps, gain_may_be_zero)


class _LayerNormSavingOutput(torch.autograd.Function):
    """y = γ ⊙ (x − mean) / sqrt(var + eps) + β over the last dim, saving only y (shared with SDPA), the per-row
    1/std (float32) and γ, β; backward recovers x̂ = (y − β) / γ (x̂ is saved as well if γ has an exact zero).
    Gradients: h = γ ⊙ g, dx = (h − mean(h) − x̂ · mean(h ⊙ x̂)) / std, dγ = Σ g ⊙ x̂, dβ = Σ g."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                weight_may_be_zero: bool = True) -> torch.Tensor:
        compute = reduction_dtype(x)
        xc = x.to(compute)
        var, mean = torch.var_mean(xc, dim=-1, keepdim=True, correction=0)
        rstd = (var + eps).rsqrt_()
        x_hat = (xc - mean).mul_(rstd)
        y = (x_hat * weight.to(compute) + bias.to(compute)).to(x.dtype)
        keep = x_hat.to(x.dtype) if weight_may_be_zero and bool((weight == 0).any()) else None
        ctx.save_for_backward(y, rstd, weight, bias, keep)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, rstd, weight, bias, x_hat = ctx.saved_tensors
        compute = rstd.dtype
        g = g.to(compute)
        w = weight.to(compute)
        x_hat = x_hat.to(compute) if x_hat is not None else (y.to(compute) - bias.to(compute)) / w
        h = g * w
        dx = (h - h.mean(-1, keepdim=True) - x_hat * (h * x_hat).mean(-1, keepdim=True)).mul_(rstd).to(y.dtype)
        dw = (g * x_hat).sum_to_size(weight.shape).to(weight.dtype) if ctx.needs_input_grad[1] else None
        db = g.sum_to_size(bias.shape).to(bias.dtype) if ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None


LAYER_NORM_EPS = 1e-6


def transform_side(side: Side, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """One side (q or k) of a variant: apply the metric, normalise, scale by the (mapped) gain, add the bias (see
    ``Side``); ``params`` holds the variant's parameters by name and, for metric variants, ``"metric"``."""
    if side.metric:  # (H_kv, 1, D), repeated to the query heads under grouped-query attention
        metric = params["metric"]
        if metric.shape[-3] != x.shape[-3]:
            metric = metric.repeat_interleave(x.shape[-3] // metric.shape[-3], dim=-3)
        x = x * metric.to(x.dtype)
    gain = params[side.gain] if side.gain else None
    if gain is not None and side.gain_fn is not None:
        gain = side.gain_fn(gain)
    if side.norm == "l2":  # a gain mapped by gain_fn (e.g. an exponential) is positive: no zero check
        return l2_normalize(x, gain=gain, gain_may_be_zero=side.gain_fn is None)
    if side.norm == "layernorm":
        ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        weight = gain if gain is not None else ones
        bias = params[side.bias] if side.bias else torch.zeros_like(ones)
        return _LayerNormSavingOutput.apply(x, weight, bias, LAYER_NORM_EPS, gain is not None)
    return x if gain is None else x * gain.to(x.dtype)


def transform_qk(
    spec: Variant, q_bhld: torch.Tensor, k_bhld: torch.Tensor, params: dict[str, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a variant's transforms (its declaration's ``q`` and ``k`` sides) with its parameters ``params`` (by
    name, broadcast against (..., H, L, D)). Gains are folded into the normalisation, so each of q̂ and k̂ is one
    saved tensor."""
    params = params or {}
    return transform_side(spec.q, q_bhld, params), transform_side(spec.k, k_bhld, params)


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
    enable_gqa: bool = True,
) -> None:
    """Raise a ValueError/TypeError that says what is wrong and what is valid.

    Shapes as in ``F.scaled_dot_product_attention``: q (..., Hq, Lq, D), k (..., Hkv, Lk, D), v (..., Hkv, Lk, Dv)
    with the same leading dims; Hq ≠ Hkv (grouped-query attention) only with ``enable_gqa``.
    """
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(f"{name} must have at least 3 dims (..., heads, length, head_dim); got shape "
                             f"{tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"query, key, value must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"query, key, value must have the same number of dims; got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        raise ValueError(f"leading (batch) dims differ: query {tuple(q.shape[:-3])}, key {tuple(k.shape[:-3])}, "
                         f"value {tuple(v.shape[:-3])}")
    (hq, lq, d), (hk, lk, dk), (hv, lv, _) = q.shape[-3:], k.shape[-3:], v.shape[-3:]
    if d != dk:
        raise ValueError(f"query and key head dims differ: {d} vs {dk}")
    if (hk, lk) != (hv, lv):
        raise ValueError(f"key and value must have the same heads and length; got key {tuple(k.shape)}, "
                         f"value {tuple(v.shape)}")
    if hq != hk and not enable_gqa:
        raise ValueError(f"query has {hq} heads but key/value have {hk}: pass enable_gqa=True for grouped-query "
                         "attention (as in F.scaled_dot_product_attention)")
    if hq % hk != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for grouped-query attention")
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass attn_mask or is_causal=True, not both (fold the causal mask into attn_mask)")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be bool (True = attend) or floating (added to logits), got {attn_mask.dtype}")
        target = (*q.shape[:-3], hq, lq, lk)
        try:
            torch.broadcast_shapes(attn_mask.shape, target)
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (..., H, Lq, Lk) = {target}"
            ) from None


def sdpa(
    q_bhld: torch.Tensor,
    k_bhld: torch.Tensor,
    v_bhld: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """One fused SDPA call with an explicit scale; float masks are cast to the query dtype. Rows whose every key
    is masked give 0 (SDPA's fused kernels already do; the explicit path is made to agree)."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q_bhld.dtype)
    enable_gqa = q_bhld.shape[-3] != k_bhld.shape[-3]
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
    query, key = transform_qk(spec, query, key)
    scale = spec.default_scale(query.shape[-1]) if scale is None else scale
    return sdpa(query, key, value, scale, attn_mask, is_causal, dropout_p)


def additive_mask(
    attn_mask: torch.Tensor | None, is_causal: bool, lq: int, lk: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """The SDPA mask (bool True = attend, or float) and causal flag as one additive float mask, or None."""
    mask = None
    if is_causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=device).tril()
        mask = torch.zeros(lq, lk, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = torch.zeros(attn_mask.shape, dtype=dtype, device=device).masked_fill(~attn_mask, float("-inf"))
        else:
            mask = attn_mask.to(dtype)
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
