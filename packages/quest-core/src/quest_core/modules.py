"""Attention modules built on AttentionKernel: a drop-in nn.MultiheadAttention and a self-attention block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quest_core.functional import additive_mask
from quest_core.kernel import AttentionKernel


def _no_native_fastpath(module: nn.Module, args: tuple) -> None:
    """A no-op forward pre-hook. Its presence stops nn.TransformerEncoderLayer's inference fast path, which
    would otherwise call torch's native MHA kernel with this module's weights and bypass the variant."""
    return None


def _as_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """nn.MultiheadAttention mask semantics (bool True = masked out, float = added) as an additive float mask."""
    if mask is None or mask.is_floating_point():
        return None if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` with a swappable attention variant.

    Same constructor arguments, parameters (state_dict keys) and forward signature as torch's module, plus
    ``variant=`` (and ``qk_scale_init=`` for the qknorm family). With ``variant="softmax"`` it computes what
    torch's module computes. Differences: ``is_causal=True`` without an ``attn_mask`` applies a causal mask
    (torch requires the mask as well); ``need_weights=True`` materialises the attention matrix, as torch does.
    """

    def __init__(self, embed_dim: int, num_heads: int, *args, variant: str = "quest",
                 qk_scale_init: float | None = None, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        self._attach_kernel(variant, qk_scale_init)

    @classmethod
    def convert(cls, mha: nn.MultiheadAttention, variant: str, qk_scale_init: float | None = None):
        """Turn an existing ``nn.MultiheadAttention`` into this class in place: same object, same parameters."""
        mha.__class__ = cls
        mha._attach_kernel(variant, qk_scale_init)
        return mha

    def _attach_kernel(self, variant: str, qk_scale_init: float | None) -> None:
        weight = self.in_proj_weight if self._qkv_same_embed_dim else self.q_proj_weight
        self.kernel = AttentionKernel(
            variant, self.num_heads, self.head_dim, qk_scale_init, device=weight.device, dtype=weight.dtype
        )
        self.register_forward_pre_hook(_no_native_fastpath)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batched = query.dim() == 3
        if not batched:  # (L, E): one sequence
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, B, E) -> (B, L, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))

        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        q_ble, k_bse, v_bse = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        batch, tgt_len = q_ble.shape[:2]

        attn_mask = _as_additive(attn_mask, q_ble.dtype)
        key_padding_mask = _as_additive(key_padding_mask, q_ble.dtype)
        if is_causal and attn_mask is not None:
            is_causal = False  # the hint says attn_mask is the causal mask: use the mask itself
        extra_keys = 0
        if self.bias_k is not None:
            k_bse = torch.cat([k_bse, self.bias_k.expand(batch, 1, -1)], dim=1)
            v_bse = torch.cat([v_bse, self.bias_v.expand(batch, 1, -1)], dim=1)
            extra_keys += 1

        q_bhld, k_bhsd, v_bhsd = (
            t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2) for t in (q_ble, k_bse, v_bse)
        )
        if self.add_zero_attn:
            zeros = k_bhsd.new_zeros(batch, self.num_heads, 1, self.head_dim)
            k_bhsd, v_bhsd = torch.cat([k_bhsd, zeros], dim=2), torch.cat([v_bhsd, zeros], dim=2)
            extra_keys += 1

        mask = None
        if attn_mask is not None:
            mask = attn_mask if attn_mask.dim() == 2 else attn_mask.view(batch, self.num_heads, tgt_len, -1)
        if key_padding_mask is not None:
            kpm = key_padding_mask.view(batch, 1, 1, -1)
            mask = kpm if mask is None else mask + kpm
        if is_causal and (mask is not None or extra_keys):  # fold the causal mask into the others
            src_len = k_bhsd.shape[2] - extra_keys
            causal = additive_mask(None, True, tgt_len, src_len, q_ble.dtype, q_ble.device)
            mask, is_causal = (causal if mask is None else mask + causal), False
        if extra_keys and mask is not None:  # the appended bias/zero keys are visible to every query
            mask = F.pad(mask, (0, extra_keys))

        out = self.kernel(
            q_bhld, k_bhsd, v_bhsd, attn_mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights,
        )
        out_bhld, probs = out if need_weights else (out, None)
        out_ble = self.out_proj(out_bhld.transpose(1, 2).flatten(2))

        if probs is not None and average_attn_weights:
            probs = probs.mean(dim=1)
        if not batched:
            return out_ble.squeeze(0), None if probs is None else probs.squeeze(0)
        if not self.batch_first:
            out_ble = out_ble.transpose(0, 1)
        return out_ble, probs


class SelfAttention(nn.Module):
    """Multi-head self-attention for new models: (B, L, dim) -> (B, L, dim).

    ``attn_mask`` follows SDPA semantics (bool True = attend, float = added), broadcast to (B, H, L, L).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        variant: str = "quest",
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        qk_scale_init: float | None = None,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim, self.attn_drop = num_heads, dim // num_heads, attn_drop
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.kernel = AttentionKernel(variant, num_heads, self.head_dim, qk_scale_init)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x_bld: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        qkv = self.qkv(x_bld).unflatten(-1, (3, self.num_heads, self.head_dim))  # (B, L, 3, H, D)
        q_bhld, k_bhld, v_bhld = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out_bhld = self.kernel(
            q_bhld, k_bhld, v_bhld, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.attn_drop if self.training else 0.0,
        )
        return self.proj_drop(self.proj(out_bhld.transpose(1, 2).flatten(2)))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block for new models: x + attn(LN(x)), then x + MLP(LN(x)), the attention a
    ``SelfAttention`` of ``variant``; (B, L, dim) -> (B, L, dim). ``attn_mask`` and ``is_causal`` go to the
    attention unchanged."""

    def __init__(self, dim: int, num_heads: int, variant: str = "quest", mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, variant, attn_drop=dropout, proj_drop=dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x_bld: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        x_bld = x_bld + self.attn(self.norm1(x_bld), attn_mask=attn_mask, is_causal=is_causal)
        return x_bld + self.mlp(self.norm2(x_bld))
