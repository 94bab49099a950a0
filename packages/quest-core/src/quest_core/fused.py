"""A fused QUEST attention kernel for GPUs, in Triton: softmax(scale · q̂ k̂ᵀ + mask) v with the (q, k) transform
applied inside the attention tiles, forward and backward.

    q̂ = g_q ⊙ q / max(‖q‖, eps)  (normalize_q; without it g_q ⊙ q),   k̂ likewise with normalize_k and g_k.

This covers the L2 family of ``quest_core.variants``: quest (k̂ only), qnorm (q̂ only), qknorm, qknorm-hs,
qknorm-ds and cosine (gains as given; ``fused_arguments`` maps a variant's declaration and parameters to this
function's arguments). LayerNorm and the elliptical metric are not fused.

Memory: autograd keeps the raw q, k, v, the output and one float32 log-sum-exp per query row; the backward kernels
recompute the per-row inverse norms from the raw tiles they load anyway, so no normalised copy of q or k exists at
any time. Gains may be a scalar (1,), one per head (H, 1, 1) or one per head dim (D,) (anything that broadcasts to
(H, 1, D)); they get gradients.

When it applies (``fused_supported`` says why not, in words): CUDA tensors, or any device with the environment
variable ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests on a CPU; float16 and float32 there, its bfloat16
dot products are wrong); float16, bfloat16 or float32; head dims
16 to 128 (any, padded to a power of two inside the kernel); grouped-query attention (fewer key/value heads);
``is_causal`` (top-left aligned, as SDPA) and a boolean key-padding mask (..., Lk), True = attend, together or
alone. A query row with no key to attend gives 0, with zero gradients. Not supported: dropout, float masks and
boolean masks that vary over heads or query rows (use ``quest_core.attention``, the SDPA path, for those).

Under ``torch.compile`` the call is a graph break (the kernels run eagerly, forward and backward).
"""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import sys
import threading

import torch

from quest_core.functional import NORM_EPS
from quest_core.variants import Variant, get_variant

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
_LOG2E = math.log2(math.e)
_INT32_MAX = 2**31 - 1  # the kernels index with 32-bit offsets
_MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension, which runs over batch × heads
_KERNELS: dict[bool, object] = {}
_KERNELS_LOCK = threading.Lock()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _kernels(interpret: bool):
    """The kernel module, executed with Triton's interpreter on or off. Loaded once per mode from
    ``_fused_kernels.py``, independently of the process-wide TRITON_INTERPRET (which Triton reads when a kernel is
    defined): CPU tests can interpret while CUDA tensors, and torch.compile's own Triton kernels, stay compiled."""
    with _KERNELS_LOCK:
        module = _KERNELS.get(interpret)
        if module is None:
            import triton

            name = f"quest_core._fused_kernels_{'interpreted' if interpret else 'compiled'}"
            spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name("_fused_kernels.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            with triton.knobs.runtime.scope():
                triton.knobs.runtime.interpret = interpret
                spec.loader.exec_module(module)
            _KERNELS[interpret] = module
        return module


def _gain_problem(gain, name: str, heads: int, head_dim: int) -> str | None:
    if gain is None:
        return None
    if not isinstance(gain, torch.Tensor) or not gain.is_floating_point():
        return f"{name} must be a floating-point tensor, got {type(gain).__name__}"
    try:
        shape = torch.broadcast_shapes(gain.shape, (heads, 1, head_dim))
    except RuntimeError:
        shape = None
    if shape is None or math.prod(shape) != heads * head_dim:
        return (f"{name} of shape {tuple(gain.shape)} must broadcast to (heads, 1, head_dim) = "
                f"({heads}, 1, {head_dim}): a scalar (1,), one per head ({heads}, 1, 1) or one per dim ({head_dim},)")
    return None


def key_padding_from_mask(attn_mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor):
    """An SDPA-style boolean ``attn_mask`` that only masks keys, i.e. of shape (..., 1, 1, Lk) (True = attend),
    as the (..., Lk) key-padding mask ``fused_attention`` takes, expanded to the leading (batch) dims of ``query``;
    None when ``attn_mask`` is None, not boolean, or varies over heads or query rows."""
    if attn_mask is None or attn_mask.dtype != torch.bool or attn_mask.dim() < 3:
        return None
    lead, lk = query.shape[:-3], key.shape[-2]
    if attn_mask.shape[-3:-1] != (1, 1) or attn_mask.shape[-1] not in (1, lk):
        return None
    mask = attn_mask[..., 0, 0, :]
    try:
        return mask.expand(*lead, lk)
    except RuntimeError:
        return None


def fused_supported(
    query, key, value, *, attn_mask=None, key_padding_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
    q_gain=None, k_gain=None, variant: str | Variant | None = None,
) -> tuple[bool, str]:
    """Whether ``fused_attention`` can run this call, and if not, why (what was given and what is valid).

    Arguments as ``fused_attention``'s, plus SDPA's ``attn_mask`` / ``dropout_p`` (the fused kernel takes neither:
    convert a key-only boolean mask with ``key_padding_from_mask``) and optionally a ``variant`` whose
    declaration must be expressible (see ``fused_arguments``). Returns ``(True, "")`` when it applies.
    """
    if not _triton_available():
        return False, "Triton is not installed (it ships with PyTorch's CUDA wheels on Linux)"
    tensors = (("query", query), ("key", key), ("value", value))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            return False, f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() < 3:
            return False, f"{name} must have shape (..., heads, length, head_dim), got {tuple(t.shape)}"
        if t.dtype not in SUPPORTED_DTYPES:
            return False, f"{name} has dtype {t.dtype}; the fused kernel takes float16, bfloat16 or float32"
        if t.numel() > _INT32_MAX:
            return False, f"{name} has {t.numel()} elements; the fused kernel indexes at most 2**31 - 1"
    if not (query.dtype == key.dtype == value.dtype):
        return False, f"query, key, value must share one dtype; got {query.dtype}, {key.dtype}, {value.dtype}"
    if not (query.device == key.device == value.device):
        return False, f"query, key, value must be on one device; got {query.device}, {key.device}, {value.device}"
    if query.device.type != "cuda" and not _interpreting():
        return False, (f"tensors are on {query.device.type}; the fused kernel needs CUDA tensors (or "
                       "TRITON_INTERPRET=1 to run it in Triton's interpreter, for tests)")
    if query.dtype == torch.bfloat16 and _interpreting():
        return False, ("Triton's interpreter computes bfloat16 dot products wrongly (it multiplies their raw bits); "
                       "run bfloat16 on CUDA, or float16/float32 in the interpreter")
    if not (query.dim() == key.dim() == value.dim()) or not (query.shape[:-3] == key.shape[:-3] == value.shape[:-3]):
        return False, (f"query, key, value must share their leading (batch) dims; got {tuple(query.shape)}, "
                       f"{tuple(key.shape)}, {tuple(value.shape)}")
    (hq, _, d), (hk, lk, dk), (hv, lv, dv) = query.shape[-3:], key.shape[-3:], value.shape[-3:]
    if d != dk:
        return False, f"query and key head dims differ: {d} vs {dk}"
    if (hk, lk) != (hv, lv):
        return False, f"key and value must have the same heads and length; got {tuple(key.shape)}, {tuple(value.shape)}"
    if hq % hk != 0:
        return False, f"query heads ({hq}) must be a multiple of key/value heads ({hk})"
    if query.numel() == 0 or key.numel() == 0:
        return False, f"empty inputs (query {tuple(query.shape)}, key {tuple(key.shape)}): nothing to fuse"
    batch_heads = math.prod(query.shape[:-2])
    if batch_heads > _MAX_GRID_Y:
        return False, (f"batch × heads is {batch_heads}; the fused kernel launches one program row per (batch, head), "
                       f"at most {_MAX_GRID_Y}")
    for name, size in (("query/key head dim", d), ("value head dim", dv)):
        if not MIN_HEAD_DIM <= size <= MAX_HEAD_DIM:
            return False, f"{name} is {size}; the fused kernel takes {MIN_HEAD_DIM} to {MAX_HEAD_DIM}"
    if dropout_p:
        return False, f"dropout_p={dropout_p}: the fused kernel has no dropout (use quest_core.attention)"
    if attn_mask is not None:
        return False, ("a general attn_mask is not fused: pass a boolean (..., Lk) key_padding_mask (see "
                       "key_padding_from_mask) and/or is_causal, or use quest_core.attention")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            return False, "key_padding_mask must be a boolean tensor (True = attend)"
        if key_padding_mask.device != query.device:
            return False, f"key_padding_mask is on {key_padding_mask.device}, the inputs on {query.device}"
        try:
            key_padding_mask.expand(*query.shape[:-3], lk)
        except RuntimeError:
            return False, (f"key_padding_mask of shape {tuple(key_padding_mask.shape)} does not broadcast to "
                           f"(..., Lk) = {(*query.shape[:-3], lk)}")
    for problem in (_gain_problem(q_gain, "q_gain", hq, d), _gain_problem(k_gain, "k_gain", hk, d)):
        if problem is not None:
            return False, problem
    if variant is not None:
        try:
            fused_arguments(variant, d)
        except ValueError as error:
            return False, str(error)
    if not isinstance(is_causal, bool):
        return False, f"is_causal must be a bool, got {type(is_causal).__name__}"
    return True, ""


def fused_arguments(variant: str | Variant, head_dim: int, params: dict[str, torch.Tensor] | None = None) -> dict:
    """``fused_attention``'s keyword arguments (normalize_q, normalize_k, q_gain, k_gain, scale) for a variant's
    declaration with its parameters ``params`` by name (as ``AttentionKernel`` holds them; gain functions such as
    cosine's clamped exponential are applied here). Without ``params`` the gains are None (unit gains); with
    ``params``, a missing gain is an error. Raises ValueError for a variant the kernel cannot express (LayerNorm,
    biases, the elliptical metric)."""
    spec = get_variant(variant)
    params = params or {}
    arguments = {"scale": spec.default_scale(head_dim)}
    for side_name, side in (("q", spec.q), ("k", spec.k)):
        if side.norm not in ("none", "l2") or side.bias is not None or side.metric:
            what = "the elliptical metric" if side.metric else "a bias" if side.norm != "layernorm" else "layernorm"
            raise ValueError(f"variant {spec.name!r} is not fused: its {side_name} side uses {what}; the fused kernel "
                             "takes L2 normalisation and gains only")
        gain = None
        if side.gain is not None:
            if side.gain not in params:
                if params:
                    raise ValueError(f"variant {spec.name!r} needs parameter {side.gain!r}; got {sorted(params)}")
            else:
                gain = params[side.gain]
                gain = side.gain_fn(gain) if side.gain_fn is not None else gain
        arguments[f"normalize_{side_name}"] = side.norm == "l2"
        arguments[f"{side_name}_gain"] = gain
    return arguments


def _gain_table(gain: torch.Tensor | None, heads: int, head_dim: int) -> torch.Tensor | None:
    """A gain broadcast to a contiguous float32 (heads, head_dim) table (autograd sums its gradient back)."""
    if gain is None:
        return None
    shape = torch.broadcast_shapes(gain.shape, (heads, 1, head_dim))
    return gain.to(torch.float32).expand(shape).reshape(heads, head_dim).contiguous()


def _tiles(head_dim_pad: int, dtype: torch.dtype, interpret: bool) -> dict[str, tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel. Not tuned on a GPU yet: flash-attention-2's usual
    starting points, smaller for float32 and head dim 128 (registers and shared memory)."""
    if interpret:  # the interpreter's cost grows with the number of programs; tests' lengths still span 2+ tiles
        return {"fwd": (32, 32, 1, 1), "dkdv": (32, 32, 1, 1), "dq": (32, 32, 1, 1)}
    if dtype != torch.float32 and head_dim_pad <= 64:
        return {"fwd": (128, 64, 4, 3), "dkdv": (32, 64, 4, 2), "dq": (64, 32, 4, 2)}
    if dtype != torch.float32:
        return {"fwd": (64, 64, 4, 2), "dkdv": (32, 64, 8, 2), "dq": (64, 32, 8, 2)}
    if head_dim_pad <= 64:
        return {"fwd": (64, 32, 4, 2), "dkdv": (32, 32, 4, 2), "dq": (32, 32, 4, 2)}
    return {"fwd": (32, 32, 4, 2), "dkdv": (32, 32, 4, 1), "dq": (32, 32, 4, 1)}


class _FusedAttention(torch.autograd.Function):
    """(B, H, Lq, D) query, (B, Hkv, Lk, D) key, (B, Hkv, Lk, Dv) value → (B, H, Lq, Dv); gains as float32
    (H, D) / (Hkv, D) tables; key padding as (B, Lk) uint8. Saves q, k, v, the output and the LSE."""

    @staticmethod
    def forward(ctx, q, k, v, q_gain_hd, k_gain_hd, kpm_bl, normalize_q, normalize_k, scale, is_causal):
        interpret = _interpreting() or q.device.type != "cuda"
        kernels = _kernels(interpret)
        b, h, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
        block_d, block_dv = max(16, 1 << (d - 1).bit_length()), max(16, 1 << (dv - 1).bit_length())
        tiles = _tiles(max(block_d, block_dv), q.dtype, interpret)
        dummy = torch.empty(1, dtype=torch.float32, device=q.device)
        out_bhld = torch.empty((b, h, lq, dv), dtype=q.dtype, device=q.device)
        lse_bhl = torch.empty((b, h, lq), dtype=torch.float32, device=q.device)
        block_m, block_n, warps, stages = tiles["fwd"]
        kernels.fwd_kernel[(triton_cdiv(lq, block_m), b * h)](
            q, k, v, _or(q_gain_hd, dummy), _or(k_gain_hd, dummy), _or(kpm_bl, dummy), out_bhld, lse_bhl,
            *q.stride(), *k.stride(), *v.stride(), *out_bhld.stride(), *_mask_strides(kpm_bl),
            h, h // hkv, lq, lk, d, dv, scale * _LOG2E, NORM_EPS,
            NORM_Q=normalize_q, NORM_K=normalize_k, Q_GAIN=q_gain_hd is not None, K_GAIN=k_gain_hd is not None,
            CAUSAL=is_causal, HAS_KPM=kpm_bl is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            BLOCK_DV=block_dv, PRECISION=_precision(q.dtype), num_warps=warps, num_stages=stages,
        )
        ctx.save_for_backward(q, k, v, out_bhld, lse_bhl, q_gain_hd, k_gain_hd, kpm_bl)
        ctx.flags = (normalize_q, normalize_k, scale, is_causal, interpret, block_d, block_dv, tiles)
        return out_bhld

    @staticmethod
    def backward(ctx, grad_out_bhld):
        q, k, v, out_bhld, lse_bhl, q_gain_hd, k_gain_hd, kpm_bl = ctx.saved_tensors
        normalize_q, normalize_k, scale, is_causal, interpret, block_d, block_dv, tiles = ctx.flags
        kernels = _kernels(interpret)
        b, h, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
        do = grad_out_bhld
        dummy = torch.empty(1, dtype=torch.float32, device=q.device)
        common = dict(
            NORM_Q=normalize_q, NORM_K=normalize_k, Q_GAIN=q_gain_hd is not None, K_GAIN=k_gain_hd is not None,
            CAUSAL=is_causal, HAS_KPM=kpm_bl is not None, BLOCK_D=block_d, BLOCK_DV=block_dv,
            PRECISION=_precision(q.dtype),
        )
        strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *_mask_strides(kpm_bl))
        inputs = (q, k, v, _or(q_gain_hd, dummy), _or(k_gain_hd, dummy), _or(kpm_bl, dummy), do, lse_bhl)

        delta_bhl = torch.empty((b, h, lq), dtype=torch.float32, device=q.device)
        block_m = tiles["dq"][0]
        kernels.bwd_preprocess_kernel[(triton_cdiv(lq, block_m), b * h)](
            out_bhld, do, delta_bhl, *out_bhld.stride(), *do.stride(), h, lq, dv, BLOCK_M=block_m,
            BLOCK_DV=block_dv,
        )

        dk_bhld = torch.empty((b, hkv, lk, d), dtype=k.dtype, device=k.device)
        dv_bhld = torch.empty((b, hkv, lk, dv), dtype=v.dtype, device=v.device)
        block_m, block_n, warps, stages = tiles["dkdv"]
        n_tiles = triton_cdiv(lk, block_n)
        k_gain_grad = k_gain_hd is not None and ctx.needs_input_grad[4]
        dk_gain_part = _partials(k_gain_grad, (b, hkv, n_tiles, block_d), dummy)
        kernels.bwd_dkdv_kernel[(n_tiles, b * hkv)](
            *inputs, delta_bhl, dk_bhld, dv_bhld, dk_gain_part, *strides,
            h, hkv, h // hkv, lq, lk, d, dv, scale * _LOG2E, scale, NORM_EPS, n_tiles,
            K_GAIN_GRAD=k_gain_grad, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common,
        )

        dq_bhld = torch.empty((b, h, lq, d), dtype=q.dtype, device=q.device)
        block_m, block_n, warps, stages = tiles["dq"]
        m_tiles = triton_cdiv(lq, block_m)
        q_gain_grad = q_gain_hd is not None and ctx.needs_input_grad[3]
        dq_gain_part = _partials(q_gain_grad, (b, h, m_tiles, block_d), dummy)
        kernels.bwd_dq_kernel[(m_tiles, b * h)](
            *inputs, delta_bhl, dq_bhld, dq_gain_part, *strides,
            h, h // hkv, lq, lk, d, dv, scale * _LOG2E, scale, NORM_EPS, m_tiles,
            Q_GAIN_GRAD=q_gain_grad, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common,
        )

        dq_gain = dq_gain_part.sum((0, 2))[:, :d] if q_gain_grad else None
        dk_gain = dk_gain_part.sum((0, 2))[:, :d] if k_gain_grad else None
        return dq_bhld, dk_bhld, dv_bhld, dq_gain, dk_gain, None, None, None, None, None


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _partials(needed: bool, shape: tuple[int, ...], dummy: torch.Tensor) -> torch.Tensor:
    """The (B, heads, tiles, BLOCK_D) float32 buffer a backward kernel writes its per-tile gain-gradient sums to
    (summed over batch and tiles afterwards: deterministic, no atomics), or the dummy when not needed."""
    return torch.empty(shape, dtype=torch.float32, device=dummy.device) if needed else dummy


def _or(t: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return default if t is None else t


def _mask_strides(kpm_bl: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if kpm_bl is None else kpm_bl.stride()


def _precision(dtype: torch.dtype) -> str:
    """float32 inputs multiply in full float32 ("ieee"), not TF32, to match SDPA's float32 accuracy."""
    return "ieee" if dtype == torch.float32 else "tf32"


@torch.compiler.disable
def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    q_gain: torch.Tensor | None = None,
    k_gain: torch.Tensor | None = None,
    normalize_q: bool = False,
    normalize_k: bool = True,
    scale: float = 1.0,
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · q̂ k̂ᵀ + mask) v in one fused Triton kernel (forward and backward); see the module docstring.

    query (..., H, Lq, D), key (..., Hkv, Lk, D), value (..., Hkv, Lk, Dv) → (..., H, Lq, Dv). The defaults are
    QUEST (unit keys, raw queries, scale 1). ``key_padding_mask``: boolean (..., Lk), True = attend. Raises
    ValueError with the reason when the kernel does not apply (``fused_supported``).
    """
    ok, reason = fused_supported(query, key, value, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                 q_gain=q_gain, k_gain=k_gain)
    if not ok:
        raise ValueError(f"fused_attention cannot run this call: {reason}")
    lead = query.shape[:-3]
    q_bhld = query.reshape(-1, *query.shape[-3:])
    k_bhld = key.reshape(-1, *key.shape[-3:])
    v_bhld = value.reshape(-1, *value.shape[-3:])
    hq, hkv, d = q_bhld.shape[1], k_bhld.shape[1], q_bhld.shape[3]
    kpm_bl = None
    if key_padding_mask is not None:
        kpm_bl = key_padding_mask.expand(*lead, k_bhld.shape[2]).reshape(-1, k_bhld.shape[2]).to(torch.uint8)
    out_bhld = _FusedAttention.apply(
        q_bhld, k_bhld, v_bhld, _gain_table(q_gain, hq, d), _gain_table(k_gain, hkv, d), kpm_bl,
        bool(normalize_q), bool(normalize_k), float(scale), is_causal,
    )
    return out_bhld.reshape(*lead, *out_bhld.shape[1:])
