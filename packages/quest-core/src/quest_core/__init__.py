"""quest_core: QUEST attention and its baselines as drop-in replacements for PyTorch attention.

QUEST (Govindarajan et al., ICLR 2026, arXiv 2604.00199) normalises each key to unit length, leaves queries free
and drops the 1/sqrt(D) scale: softmax(Q K̄ᵀ) V. Every variant here is a transform of (q, k) followed by one
fused ``F.scaled_dot_product_attention`` call with an explicit scale.

- ``attention(q, k, v, variant=...)``: functional, SDPA semantics, parameter-free variants.
- ``AttentionKernel``: the same as a module, owning the learnable parameters its variant declares.
- ``register_variant(Variant(...))``: add a variant (one declaration; see ``quest_core.variants``).
- ``MultiheadAttention``: drop-in for ``torch.nn.MultiheadAttention``; ``SelfAttention``: a block for new models.
- ``swap_attention(model, variant)``: in-place surgery of third-party models; ``timm_attn_layer(variant)``.
- ``link_elliptical(model)``: the inter-layer state of the elliptical variants, for models built directly.
- ``Telemetry``: opt-in per-layer query/key norms, max logit and attention entropy.
"""

from quest_core.elliptical import MetricChain, link_elliptical
from quest_core.functional import attention, l2_normalize
from quest_core.kernel import AttentionKernel, no_weight_decay
from quest_core.modules import MultiheadAttention, SelfAttention
from quest_core.surgery import SwapReport, swap_attention
from quest_core.telemetry import Telemetry, summarize
from quest_core.variants import (Param, Side, Variant, VariantSpec, get_variant, henry_scale_init, list_variants,
                                 register_variant)

__all__ = [
    "AttentionKernel", "MetricChain", "MultiheadAttention", "Param", "SelfAttention", "Side", "SwapReport", "Telemetry", "Variant",
    "VariantSpec", "attention", "get_variant", "henry_scale_init", "l2_normalize", "link_elliptical", "list_variants",
    "no_weight_decay", "register_variant", "summarize", "swap_attention", "timm_attn_layer",
]


def timm_attn_layer(variant: str):
    """The class to pass as timm's ``attn_layer=`` for ``variant`` (imports timm)."""
    from quest_core.timm_layers import timm_attn_layer as _layer

    return _layer(variant)
