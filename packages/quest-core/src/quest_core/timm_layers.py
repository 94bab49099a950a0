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
- ConViT's ``MHSA``: ``ConvitMHSA`` (standard softmax(q kᵀ · scale) v);
- ConViT's ``GPSA`` (gated positional self-attention): ``ConvitGPSA``. Its attention is a per-head gated mix
  (1 − σ(g)) · softmax(q kᵀ · scale) + σ(g) · softmax(positional scores), renormalised, times v; the variant replaces
  the content branch (its transform of q and k, its scale) and the positional branch, which has no keys, is kept.
  The content matrix is materialised, as timm's GPSA does;
- CaiT's ``ClassAttn`` (also XCiT's class-attention blocks): ``CaitClassAttn`` (the class token's query against
  every token's key).

Known attention modules with no QUEST form are in ``UNSUPPORTED`` with the reason (``swap_attention`` reports it):
XCiT's ``XCA`` (cross-covariance attention) is a softmax over a channel × channel product of q and k normalised
along the tokens, with a learned temperature; QUEST normalises each key over the head dimension in token-to-token
attention, which has no counterpart there.
Each subclass keeps timm's constructor, parameters and the forward up to the attention product, which is written
out here (timm has no hook for it) and replaced by ``AttentionKernel``. One subclass per (host, variant) is created
at import time, so models that contain them pickle by reference, and its class name says the variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention, apply_rot_embed_cat
from timm.models.cait import ClassAttn
from timm.models.convit import GPSA, MHSA
from timm.models.eva import EvaAttention
from timm.models.swin_transformer import WindowAttention
from timm.models.xcit import XCA

from quest_core.kernel import AttentionKernel
from quest_core.variants import get_variant, list_variants


def _attach_kernel(self, variant: str, qk_scale_init: float | None = None) -> None:
    """Give a timm attention module its ``AttentionKernel`` (heads and head dim from its output projection, whose
    input is the heads' concatenation in every host here)."""
    weight = self.proj.weight
    self.kernel = AttentionKernel(variant, self.num_heads, weight.shape[1] // self.num_heads, qk_scale_init,
                                  device=weight.device, dtype=weight.dtype)


class TimmAttention(Attention):
    """timm ``Attention`` with the product computed by a quest_core variant (``variant`` class attribute)."""

    variant = "quest"

    def __init__(self, *args, qk_scale_init: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.attach_kernel(self.variant, qk_scale_init)

    attach_kernel = _attach_kernel

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

    attach_kernel = _attach_kernel

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

    attach_kernel = _attach_kernel

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


class ConvitMHSA(MHSA):
    """ConViT's ``MHSA`` (plain multi-head self-attention) with the product computed by a quest_core variant."""

    variant = "quest"

    attach_kernel = _attach_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q_bhld, k_bhld, v_bhld = qkv.unbind(0)
        out_bhld = self.kernel(q_bhld, k_bhld, v_bhld, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out_bhld.transpose(1, 2).reshape(B, N, C)))

    def get_attention_map(self, x: torch.Tensor, return_map: bool = False):
        """timm's mean attention distance per head (and the batch-mean map), from the variant's attention."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        attn_map_hnn = self.kernel.probs(qkv[0], qkv[1]).mean(0)
        side = int(N ** 0.5)
        coords_n2 = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).flatten(0, 1)
        distances_nn = torch.cdist(coords_n2.to(attn_map_hnn), coords_n2.to(attn_map_hnn))
        dist_h = torch.einsum("nm,hnm->h", distances_nn, attn_map_hnn) / N
        return (dist_h, attn_map_hnn) if return_map else dist_h


class ConvitGPSA(GPSA):
    """ConViT's gated positional self-attention with its content branch, softmax(q kᵀ · scale), computed by a
    quest_core variant; the positional branch and the per-head gate are timm's."""

    variant = "quest"

    attach_kernel = _attach_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        if self.rel_indices is None or self.rel_indices.shape[1] != N:
            self.rel_indices = self.get_rel_indices(N)
        v_bhld = self.v(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        attn_bhnn = self.attention(x, v_bhld)
        return self.proj_drop(self.proj((attn_bhnn @ v_bhld).transpose(1, 2).reshape(B, N, C)))

    def get_attention(self, x: torch.Tensor) -> torch.Tensor:
        """The (B, H, N, N) gated attention (timm's ``get_attention_map`` uses it)."""
        return self.attention(x, None)

    def attention(self, x: torch.Tensor, v_bhld: torch.Tensor | None) -> torch.Tensor:
        """(1 − σ(g)) · content + σ(g) · positional, renormalised and dropped out as timm does. The content matrix
        comes from the kernel's forward when the values are given (telemetry and elliptical metrics see the call),
        else from ``kernel.probs``."""
        B, N, C = x.shape
        qk = self.qk(x).reshape(B, N, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q_bhld, k_bhld = qk.unbind(0)
        if v_bhld is None:
            content_bhnn = self.kernel.probs(q_bhld, k_bhld)
        else:
            _, content_bhnn = self.kernel(q_bhld, k_bhld, v_bhld, need_weights=True)
        pos_bhnn = self.pos_proj(self.rel_indices.expand(B, -1, -1, -1)).permute(0, 3, 1, 2).softmax(dim=-1)
        gate_h11 = torch.sigmoid(self.gating_param.view(1, -1, 1, 1))
        attn_bhnn = (1.0 - gate_h11) * content_bhnn + gate_h11 * pos_bhnn
        return self.attn_drop(attn_bhnn / attn_bhnn.sum(dim=-1, keepdim=True))


class CaitClassAttn(ClassAttn):
    """CaiT's class attention (the class token's query against all tokens; XCiT uses it too) with the product
    computed by a quest_core variant."""

    variant = "quest"

    attach_kernel = _attach_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        heads = lambda t, n: t.reshape(B, n, self.num_heads, C // self.num_heads).transpose(1, 2)  # noqa: E731
        q_bhld = heads(self.q(x[:, 0]).unsqueeze(1), 1)
        k_bhld, v_bhld = heads(self.k(x), N), heads(self.v(x), N)
        out_bhld = self.kernel(q_bhld, k_bhld, v_bhld, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out_bhld.transpose(1, 2).reshape(B, 1, C)))


HOSTS = {Attention: TimmAttention, WindowAttention: SwinWindowAttention, EvaAttention: EvaQuestAttention,
         MHSA: ConvitMHSA, GPSA: ConvitGPSA, ClassAttn: CaitClassAttn}
UNSUPPORTED = {
    XCA: "not supported: XCiT's cross-covariance attention is a softmax over a channel x channel product of q and k "
         "L2-normalised along the tokens, with a learned temperature; QUEST normalises each key over the head "
         "dimension in token-to-token attention, which has no counterpart in it",
}
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


def unsupported_reason(module) -> str | None:
    """Why a known timm attention module has no variant form (``UNSUPPORTED``); None if it is not listed."""
    return UNSUPPORTED.get(type(module))
