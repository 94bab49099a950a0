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

    Loading a state dict that has no gains (a checkpoint of the model before ``swap_attention``, or of a
    parameter-free variant) fills them with their initial values, so ``load_state_dict(strict=True)`` works and
    the swapped model starts where a fresh one would. Gains whose shape does not fit this kernel's heads or head
    dim fail with a clear error.
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
        self._gain_init = {name: p.detach().clone() for name, p in self.named_parameters(recurse=False)}
        self.register_load_state_dict_pre_hook(_fill_missing_gains)

    def gains(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(q_gain, k_gain), each None where the variant has none."""
        return getattr(self, "q_gain", None), getattr(self, "k_gain", None)

    def check_shapes(self, q_bhld: torch.Tensor) -> None:
        """The gains broadcast against (B, H, L, D) only if the input has this kernel's heads and head dim."""
        if self._gain_init and (q_bhld.shape[-3], q_bhld.shape[-1]) != (self.num_heads, self.head_dim):
            raise ValueError(
                f"variant {self.variant!r} has gains for {self.num_heads} heads of dim {self.head_dim}, but the "
                f"query has {q_bhld.shape[-3]} heads of dim {q_bhld.shape[-1]} (shape {tuple(q_bhld.shape)}); "
                "build the kernel with the model's num_heads and head_dim"
            )

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
        self.check_shapes(q_bhld)
        q_bhld, k_bhld = transform_qk(self.spec, q_bhld, k_bhld, *self.gains())
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
        self.check_shapes(q_bhld)
        q_raw, k_raw = q_bhld, k_bhld
        q_bhld, k_bhld = transform_qk(self.spec, q_bhld, k_bhld, *self.gains())
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


def _fill_missing_gains(module: AttentionKernel, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: gains absent from ``state_dict`` are loaded as their initial values."""
    for name, init in module._gain_init.items():
        state_dict.setdefault(prefix + name, init.clone())
