"""AttentionKernel: one variant's (q, k) transform, its learnable scales (if any), and the fused SDPA call."""

from __future__ import annotations

import math

import torch
from torch import nn

from quest_core.functional import attention_probs, check_inputs, sdpa, transform_qk
from quest_core.telemetry import LayerStats, attention_stats
from quest_core.variants import get_variant


class AttentionKernel(nn.Module):
    """softmax(scale · q̂ k̂ᵀ + mask) v for one variant, on (B, H, L, D) tensors.

    Owns the learnable gains of the qknorm family (see ``quest_core.variants`` for their initialisation):
    ``qknorm``: ``q_gain`` (1,); ``qknorm-hs``: ``q_gain`` (H, 1, 1); ``qknorm-ds``: ``q_gain`` and
    ``k_gain`` (D,). ``qk_scale_init`` overrides the initial value of the qknorm/qknorm-hs scale
    (default sqrt(D); Henry et al.'s is ``quest_core.henry_scale_init(seq_len)``).
    """

    def __init__(
        self,
        variant: str,
        num_heads: int,
        head_dim: int,
        qk_scale_init: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.spec = get_variant(variant)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.telemetry: LayerStats | None = None  # set by quest_core.Telemetry
        factory = {"device": device, "dtype": dtype}
        init = math.sqrt(head_dim) if qk_scale_init is None else float(qk_scale_init)
        if self.spec.learnable == "scalar":
            self.q_gain = nn.Parameter(torch.full((1,), init, **factory))
        elif self.spec.learnable == "head":
            self.q_gain = nn.Parameter(torch.full((num_heads, 1, 1), init, **factory))
        elif self.spec.learnable == "dim":
            self.q_gain = nn.Parameter(torch.ones(head_dim, **factory))
            self.k_gain = nn.Parameter(torch.ones(head_dim, **factory))

    @property
    def variant(self) -> str:
        return self.spec.name

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, num_heads={self.num_heads}, head_dim={self.head_dim}"

    def probs(
        self, q_bhld: torch.Tensor, k_bhld: torch.Tensor, attn_mask: torch.Tensor | None = None,
        is_causal: bool = False, scale: float | None = None,
    ) -> torch.Tensor:
        """The (B, H, Lq, Lk) attention matrix this kernel uses for q and k (materialised: for figures)."""
        q_bhld, k_bhld = transform_qk(
            self.spec, q_bhld, k_bhld, getattr(self, "q_gain", None), getattr(self, "k_gain", None)
        )
        scale = self.spec.default_scale(q_bhld.shape[-1]) if scale is None else scale
        return attention_probs(q_bhld, k_bhld, scale, attn_mask, is_causal)

    def forward(
        self,
        q_bhld: torch.Tensor,
        k_bhld: torch.Tensor,
        v_bhld: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        scale: float | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The attention output (B, H, Lq, Dv); with ``need_weights`` also the (B, H, Lq, Lk) probabilities.

        ``need_weights`` materialises the attention matrix (the explicit path, as torch's MHA does);
        otherwise the call is one fused SDPA kernel.
        """
        check_inputs(q_bhld, k_bhld, v_bhld, attn_mask, is_causal)
        q_raw, k_raw = q_bhld, k_bhld
        q_bhld, k_bhld = transform_qk(
            self.spec, q_bhld, k_bhld, getattr(self, "q_gain", None), getattr(self, "k_gain", None)
        )
        scale = self.spec.default_scale(q_bhld.shape[-1]) if scale is None else scale
        if self.telemetry is not None:
            self.telemetry.update(
                attention_stats(
                    q_raw, k_raw, q_bhld, k_bhld, scale, attn_mask, is_causal, self.telemetry.max_queries
                )
            )
        if not need_weights:
            return sdpa(q_bhld, k_bhld, v_bhld, scale, attn_mask, is_causal, dropout_p)
        probs = attention_probs(q_bhld, k_bhld, scale, attn_mask, is_causal)
        dropped = nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs
        if v_bhld.shape[1] != probs.shape[1]:
            v_bhld = v_bhld.repeat_interleave(probs.shape[1] // v_bhld.shape[1], dim=1)
        return dropped @ v_bhld, probs
