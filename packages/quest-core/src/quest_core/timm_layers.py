"""timm integration: subclasses of timm's attention modules that run a quest_core variant (imports timm; load
lazily).

``quest_core.timm_attn_layer(variant)`` returns the class for timm's ``attn_layer=`` hook, so any timm
VisionTransformer runs any variant without a copy of ViT code:

    timm.create_model("vit_tiny_patch16_224", attn_layer=quest_core.timm_attn_layer("quest"))

Hosts, each converted in place by ``swap_attention`` (same object, same parameters):
- ``timm.layers.Attention`` (ViT, DeiT, ...): ``TimmAttention``;
- Swin's ``WindowAttention``: ``SwinWindowAttention``; the relative position bias (and the shifted-window mask,
  with timm's -100 made -inf) are added to the variant's logits, as Swin-v2 adds its bias to its cosine logits;
- EVA's ``EvaAttention`` (EVA-02, with rotary embeddings): ``EvaQuestAttention``; the rotary embedding is applied
  to q and k before the variant's transform (QUEST normalises the rotated key; a rotation keeps its norm).
Each subclass keeps timm's constructor, parameters and the forward up to the attention product, which is written
out here (timm has no hook for it) and replaced by ``AttentionKernel``. One subclass per (host, variant) is created
at import time, so models that contain them pickle by reference, and its class name says the variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention, apply_rot_embed_cat
from timm.models.eva import EvaAttention
from timm.models.swin_transformer import WindowAttention

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


class SwinWindowAttention(WindowAttention):
    """Swin's window attention (W-MSA / SW-MSA) with the product computed by a quest_core variant."""

    variant = "quest"

    def attach_kernel(self, variant: str, qk_scale_init: float | None = None) -> None:
        weight = self.qkv.weight
        head_dim = weight.shape[0] // 3 // self.num_heads
        self.kernel = AttentionKernel(
            variant, self.num_heads, head_dim, qk_scale_init, device=weight.device, dtype=weight.dtype
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B_, N, _ = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q_bhld, k_bhld, v_bhld = qkv.unbind(0)
        bias = self._get_rel_pos_bias()  # (1, H, N, N)
        if mask is not None:  # shifted windows: (num_windows, N, N), 0 or -100 (timm's "masked"), per window of
            # each image; -100 is made -inf: QUEST's and cosine's logits are not bounded by 100
            mask = mask.masked_fill(mask < 0, float("-inf"))
            num_win = mask.shape[0]
            mask = mask.view(1, num_win, 1, N, N).expand(B_ // num_win, -1, self.num_heads, -1, -1)
            bias = bias + mask.reshape(-1, self.num_heads, N, N)
        out_bhld = self.kernel(q_bhld, k_bhld, v_bhld, attn_mask=bias,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out_bhld.transpose(1, 2).reshape(B_, N, -1)))


class EvaQuestAttention(EvaAttention):
    """EVA's attention (fused or separate q/k/v projections, q/k norms, rotary embeddings, gating) with the product
    computed by a quest_core variant."""

    variant = "quest"

    def attach_kernel(self, variant: str, qk_scale_init: float | None = None) -> None:
        weight = self.proj.weight
        self.kernel = AttentionKernel(
            variant, self.num_heads, self.head_dim, qk_scale_init, device=weight.device, dtype=weight.dtype
        )

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        if self.qkv is not None:
            if self.q_bias is None:
                qkv = self.qkv(x)
            else:
                qkv_bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
                qkv = self.qkv(x) + qkv_bias if self.qkv_bias_separate else F.linear(x, self.qkv.weight, qkv_bias)
            q_bhld, k_bhld, v_bhld = qkv.reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q_bhld, k_bhld, v_bhld = (proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
                                      for proj in (self.q_proj, self.k_proj, self.v_proj))
        q_bhld, k_bhld = self.q_norm(q_bhld), self.k_norm(k_bhld)
        if rope is not None:
            npt, half = self.num_prefix_tokens, getattr(self, "rotate_half", False)
            q_bhld, k_bhld = (
                torch.cat([t[:, :, :npt], apply_rot_embed_cat(t[:, :, npt:], rope, half=half)], dim=2).type_as(v_bhld)
                for t in (q_bhld, k_bhld)
            )
        out_bhld = self.kernel(q_bhld, k_bhld, v_bhld, attn_mask=attn_mask, is_causal=is_causal,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        x = self.norm(out_bhld.transpose(1, 2).reshape(B, N, C))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


HOSTS = {Attention: TimmAttention, WindowAttention: SwinWindowAttention, EvaAttention: EvaQuestAttention}
_LAYERS: dict[type, dict[str, type]] = {}
for _base in HOSTS.values():
    _LAYERS[_base] = {}
    for _name in list_variants():
        _cls_name = f"{_base.__name__}_{_name.replace('-', '_')}"
        _LAYERS[_base][_name] = type(_cls_name, (_base,), {"variant": _name, "__module__": __name__})
        globals()[_cls_name] = _LAYERS[_base][_name]


def timm_attn_layer(variant: str) -> type[TimmAttention]:
    """The timm ``attn_layer`` class for ``variant``."""
    return _LAYERS[TimmAttention][get_variant(variant).name]


def quest_base(module) -> type | None:
    """The quest subclass family for a timm attention module: its exact class is one of timm's hosts, or it was
    converted before. None for anything else (subclasses of the hosts change the forward: not converted)."""
    if type(module) in HOSTS:
        return HOSTS[type(module)]
    return next((base for base in HOSTS.values() if isinstance(module, base)), None)


def convert(module, variant: str, qk_scale_init: float | None = None):
    """Turn a timm attention module (or an earlier conversion) into the variant's subclass in place."""
    base = quest_base(module)
    if base is None:
        raise TypeError(f"no timm swap rule for {type(module).__name__}; hosts: {[h.__name__ for h in HOSTS]}")
    name = get_variant(variant).name
    module.__class__ = _LAYERS[base][name]
    module.attach_kernel(name, qk_scale_init)
    return module
