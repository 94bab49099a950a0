"""timm integration: ``Attention`` subclasses that run a quest_core variant (imports timm; load lazily).

``quest_core.timm_attn_layer(variant)`` returns the class for timm's ``attn_layer=`` hook, so any timm
VisionTransformer runs any variant without a copy of ViT code:

    timm.create_model("vit_tiny_patch16_224", attn_layer=quest_core.timm_attn_layer("quest"))

The subclass keeps timm's constructor, parameters and forward (qk_norm, scale_norm, gating included) and only
replaces the attention product by ``AttentionKernel``. One subclass per variant is created at import time, so
models that contain them pickle by reference.
"""

from __future__ import annotations

import torch
from timm.layers import Attention

from quest_core.kernel import AttentionKernel
from quest_core.variants import get_variant, list_variants


class TimmAttention(Attention):
    """timm ``Attention`` with the product computed by a quest_core variant (``variant`` class attribute)."""

    variant = "quest"

    def __init__(self, *args, qk_scale_init: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.attach_kernel(self.variant, qk_scale_init)

    def attach_kernel(self, variant: str, qk_scale_init: float | None = None) -> None:
        weight = self.qkv.weight
        self.kernel = AttentionKernel(
            variant, self.num_heads, self.head_dim, qk_scale_init, device=weight.device, dtype=weight.dtype
        )

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q_bhld, k_bhld, v_bhld = qkv.unbind(0)
        q_bhld, k_bhld = self.q_norm(q_bhld), self.k_norm(k_bhld)
        out_bhld = self.kernel(
            q_bhld, k_bhld, v_bhld, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.attn_drop.p if self.training else 0.0,
        )
        x = self.norm(out_bhld.transpose(1, 2).reshape(B, N, self.attn_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


_LAYERS: dict[str, type[TimmAttention]] = {}
for _name in list_variants():
    _cls_name = "TimmAttention_" + _name.replace("-", "_")
    _LAYERS[_name] = type(_cls_name, (TimmAttention,), {"variant": _name, "__module__": __name__})
    globals()[_cls_name] = _LAYERS[_name]


def timm_attn_layer(variant: str) -> type[TimmAttention]:
    """The timm ``attn_layer`` class for ``variant``."""
    return _LAYERS[get_variant(variant).name]


def convert(module: Attention, variant: str, qk_scale_init: float | None = None) -> TimmAttention:
    """Turn a timm ``Attention`` into the variant's subclass in place (same object, same parameters)."""
    module.__class__ = timm_attn_layer(variant)
    module.attach_kernel(variant, qk_scale_init)
    return module
