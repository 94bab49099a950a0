"""timm's VisionTransformer with quest-core attention (timm's ``attn_layer`` hook), behind pixel normalisation."""

from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

import quest_core


class Classifier(nn.Module):
    """(B, C, H, W) images in [0, 1] -> logits: normalise, then the ViT."""

    def __init__(self, vit: VisionTransformer, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.vit = vit
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x_bchw: torch.Tensor) -> torch.Tensor:
        return self.vit((x_bchw - self.mean) / self.std)


def build_vit(variant: str, img_size: int, patch_size: int, in_chans: int, num_classes: int, embed_dim: int,
              depth: int, num_heads: int, mlp_ratio: float, drop_path: float = 0.0) -> VisionTransformer:
    vit = VisionTransformer(
        img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes, embed_dim=embed_dim,
        depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, drop_path_rate=drop_path,
        attn_layer=quest_core.timm_attn_layer(variant),
    )
    return vit


@torch.no_grad()
def cls_attention(model: Classifier, x_bchw: torch.Tensor, block: int = -1) -> torch.Tensor:
    """The CLS token's attention over the patch tokens in one block, mean over heads: (B, grid_h, grid_w)."""
    vit = model.vit
    attn = vit.blocks[block].attn
    captured = {}
    handle = attn.register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    try:
        model(x_bchw)
    finally:
        handle.remove()
    x = captured["x"]
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    probs = attn.kernel.probs(q, k)  # (B, H, N, N)
    cls_row = probs[:, :, 0, vit.num_prefix_tokens:].mean(dim=1)
    grid = vit.patch_embed.grid_size
    return cls_row.reshape(b, *grid)
