"""Functional attention: a (q, k) transform followed by one fused SDPA call with an explicit scale.

Layout and mask semantics are those of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); a boolean ``attn_mask`` is True where attention is
allowed, a float mask is added to the logits; ``is_causal`` masks the upper triangle (top-left aligned).
Fewer key/value heads than query heads (Hq % Hkv == 0) is grouped-query attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quest_core.variants import VariantSpec, get_variant

NORM_EPS = 1e-6  # an all-zero vector normalises to zero instead of NaN


class _L2Normalize(torch.autograd.Function):
    """y = x / max(‖x‖, eps) over the last dim, with a fused backward: dx = (g − y (g·y)) / ‖x‖.

    Same values and gradients as ``F.normalize``, in about half the time on CPU (F.normalize's autograd graph
    is norm -> clamp -> expand -> div, each with its own backward pass over the tensor).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True)
        active = norm > eps  # where the clamp is active, y = x / eps is linear in x
        inv = norm.clamp_min(eps).reciprocal()
        y = x * inv
        ctx.save_for_backward(y, inv, active)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, inv, active = ctx.saved_tensors
        dot = (g.unsqueeze(-2) @ y.unsqueeze(-1)).squeeze(-1) * active  # (..., 1), no (..., D) temporary
        dx = y * dot.neg_()  # one (..., D) buffer, updated in place
        return dx.add_(g).mul_(inv), None


def l2_normalize(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / max(‖x‖, eps) over the last dim, computed in float32 (or float64) and cast back."""
    compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _L2Normalize.apply(x.to(compute_dtype), eps).to(x.dtype)


def transform_qk(
    spec: VariantSpec,
    q_bhld: torch.Tensor,
    k_bhld: torch.Tensor,
    q_gain: torch.Tensor | None = None,
    k_gain: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a variant's normalisation and learnable gains (broadcast against (B, H, L, D)) to q and k."""
    if spec.normalize_q:
        q_bhld = l2_normalize(q_bhld)
    if spec.normalize_k:
        k_bhld = l2_normalize(k_bhld)
    if q_gain is not None:
        q_bhld = q_bhld * q_gain.to(q_bhld.dtype)
    if k_gain is not None:
        k_bhld = k_bhld * k_gain.to(k_bhld.dtype)
    return q_bhld, k_bhld


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
) -> None:
    """Raise a ValueError/TypeError that says what is wrong and what is valid."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, length, head_dim); got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    (b, hq, lq, d), (bk, hk, lk, dk), (bv, hv, lv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv):
        raise ValueError(f"batch sizes differ: q {b}, k {bk}, v {bv}")
    if d != dk:
        raise ValueError(f"q and k head dims differ: {d} vs {dk}")
    if (hk, lk) != (hv, lv):
        raise ValueError(f"k and v must have the same heads and length; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if hq % hk != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for grouped-query attention")
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass attn_mask or is_causal=True, not both (fold the causal mask into attn_mask)")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be bool (True = attend) or floating (added to logits), got {attn_mask.dtype}")
        try:
            torch.broadcast_shapes(attn_mask.shape, (b, hq, lq, lk))
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, Lq, Lk) = {(b, hq, lq, lk)}"
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
    """One fused SDPA call with an explicit scale; float masks are cast to the query dtype."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q_bhld.dtype)
    enable_gqa = q_bhld.shape[1] != k_bhld.shape[1]
    return F.scaled_dot_product_attention(
        q_bhld, k_bhld, v_bhld, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa,
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    variant: str = "quest",
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention with a parameter-free variant, as a drop-in for ``F.scaled_dot_product_attention``.

    ``scale=None`` is the variant's own default (1/sqrt(D) for softmax, 1 for quest and qnorm). Variants with
    learnable scales (qknorm, qknorm-hs, qknorm-ds) own parameters: use ``quest_core.AttentionKernel`` or the
    modules built on it.
    """
    spec = get_variant(variant)
    if not spec.is_parameter_free:
        raise ValueError(
            f"variant {spec.name!r} has learnable scales, so it is a module: use quest_core.AttentionKernel, "
            "quest_core.SelfAttention or quest_core.MultiheadAttention (functional variants: "
            "softmax, quest, qnorm)"
        )
    check_inputs(q, k, v, attn_mask, is_causal)
    q, k = transform_qk(spec, q, k)
    scale = spec.default_scale(q.shape[-1]) if scale is None else scale
    return sdpa(q, k, v, scale, attn_mask, is_causal, dropout_p)


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
    """The (B, H, Lq, Lk) attention matrix of already-transformed q and k (materialised: for need_weights)."""
    if k_bhld.shape[1] != q_bhld.shape[1]:
        k_bhld = k_bhld.repeat_interleave(q_bhld.shape[1] // k_bhld.shape[1], dim=1)
    logits = (q_bhld @ k_bhld.transpose(-2, -1)) * scale
    mask = additive_mask(attn_mask, is_causal, q_bhld.shape[-2], k_bhld.shape[-2], logits.dtype, logits.device)
    if mask is not None:
        logits = logits + mask
    return logits.softmax(dim=-1)
