"""quest_core: QUEST attention and its baselines as drop-in replacements for PyTorch attention.

QUEST (Govindarajan et al., ICLR 2026, arXiv 2604.00199) normalises each key to unit length, leaves queries free
and drops the 1/sqrt(D) scale: softmax(Q K̄ᵀ) V. Every variant here is a transform of (q, k) followed by one
fused ``F.scaled_dot_product_attention`` call with an explicit scale.

- ``attention(q, k, v, variant=...)``: functional, SDPA semantics, parameter-free variants.
- ``AttentionKernel``: the same as a module, owning the learnable parameters its variant declares.
- ``register_variant(Variant(...))``: add a variant (one declaration; see ``quest_core.variants``).
- ``MultiheadAttention``: drop-in for ``torch.nn.MultiheadAttention``; ``SelfAttention`` and ``TransformerBlock`` (pre-norm attention + MLP): blocks for new models.
- ``swap_attention(model, variant)``: in-place surgery of third-party models; ``timm_attn_layer(variant)``.
- ``link_elliptical(model)``: the inter-layer state of the elliptical variants (kernels link the model they run in
  at their first call; this picks the model explicitly).
- ``Telemetry``: opt-in per-layer query/key norms, max logit and attention entropy.
- ``saved_bytes(fn)``, ``peak_bytes(fn)``: memory kept for backward and the allocator's peak (``quest_core.memory``).
"""

import importlib

# Names load on first use (PEP 562), so that `import quest_core` and the variant registry (pure Python) do not
# import torch: a command that only lists variants stays fast. `from quest_core import X` works as usual.
_EXPORTS = {
    "MetricChain": "elliptical", "link_elliptical": "elliptical",
    "attention": "functional", "l2_normalize": "functional",
    "AttentionKernel": "kernel", "no_weight_decay": "kernel",
    "MultiheadAttention": "modules", "SelfAttention": "modules", "TransformerBlock": "modules",
    "SwapReport": "surgery", "swap_attention": "surgery",
    "Telemetry": "telemetry", "summarize": "telemetry",
    "peak_bytes": "memory", "saved_bytes": "memory",
    **{name: "variants" for name in ("Param", "Side", "Variant", "VariantSpec", "get_variant", "henry_scale_init",
                                     "list_variants", "register_variant")},
}
__all__ = sorted([*_EXPORTS, "timm_attn_layer"])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'quest_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"quest_core.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


def timm_attn_layer(variant: str):
    """The class to pass as timm's ``attn_layer=`` for ``variant`` (imports timm)."""
    from quest_core.timm_layers import timm_attn_layer as _layer

    return _layer(variant)
