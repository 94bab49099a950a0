"""A transformer encoder for multivariate series whose attention is a quest-core variant.

Tokens are patches of ``patch_len`` consecutive steps (one step per token with ``patch_len=1``): a linear embedding
of the patch's values (0 where a step is unobserved) together with its observed-step flags, plus a sinusoidal
embedding of the patch's position in time (no length limit, and a missing step leaves the others at their own
times). Pre-norm blocks (``quest_core.TransformerBlock``: LayerNorm -> attention -> residual; LayerNorm -> GELU MLP -> residual),
a final LayerNorm, the mean over valid tokens, a linear head. Built from quest-core's modules directly, as the
``lm`` and ``points`` models are (no surgery).

A token is valid if any of its steps is observed. Invalid tokens (padding, missing steps) are masked out as keys in
every block and left out of the pool, so they never reach a valid output: a series gives the same logits alone or
batched with longer ones, and a series with missing steps the same as the series with those steps deleted.

The elliptical variants estimate their metric per series from the values of consecutive layers, averaged over the
keys some query may see (``quest_core.elliptical``): the key mask leaves padding and missing steps out of it too.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from quest_core import TransformerBlock


def sinusoidal(pos_bl: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Transformer position encodings (B, L, dim) of (possibly fractional) positions, in float32 (float64 for a
    float64 ``dtype``)."""
    dtype = torch.float64 if dtype == torch.float64 else torch.float32
    freq = torch.exp(torch.arange(0, dim, 2, device=pos_bl.device, dtype=dtype) * (-math.log(1e4) / dim))
    angle_blf = pos_bl.to(dtype)[..., None] * freq
    return torch.stack([angle_blf.sin(), angle_blf.cos()], -1).flatten(-2)[..., :dim]


class SeriesTransformer(nn.Module):
    """Values (B, T, C) and observed steps (B, T) -> class logits (B, classes)."""

    def __init__(self, channels: int, num_classes: int, variant: str, patch_len: int = 1, dim: int = 64,
                 depth: int = 2, num_heads: int = 4, mlp_ratio: float = 2.0, dropout: float = 0.1):
        super().__init__()
        self.channels, self.patch_len, self.dim = channels, patch_len, dim
        self.embed = nn.Linear(patch_len * (channels + 1), dim)  # values and observed flags of each step
        self.blocks = nn.ModuleList(TransformerBlock(dim, num_heads, variant, mlp_ratio, dropout)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def tokens(self, x_btc: torch.Tensor, observed_bt: torch.Tensor, time_bt: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings with positions (B, L, dim) and valid tokens (B, L), L = ceil(T / patch_len).
        ``time_bt``: each step's time index (default 0..T-1); a patch sits at its first step's time / patch_len."""
        b, t, c = x_btc.shape
        if c != self.channels:
            raise ValueError(f"the model takes {self.channels} channels, got a series with {c}")
        p = self.patch_len
        extra = -t % p
        time_bt = torch.arange(t, device=x_btc.device).expand(b, t) if time_bt is None else time_bt
        if extra:  # pad to whole patches (unobserved)
            x_btc = nn.functional.pad(x_btc, (0, 0, 0, extra))
            observed_bt = nn.functional.pad(observed_bt, (0, extra))
            time_bt = nn.functional.pad(time_bt, (0, extra))
        obs_blp = observed_bt.view(b, -1, p)
        values_blpc = x_btc.view(b, -1, p, c) * obs_blp[..., None].to(x_btc.dtype)
        feats = torch.cat([values_blpc.flatten(2), obs_blp.to(x_btc.dtype)], -1)
        pos_bl = time_bt.view(b, -1, p)[..., 0] / p
        return self.embed(feats) + sinusoidal(pos_bl, self.dim, x_btc.dtype).to(x_btc.dtype), obs_blp.any(-1)

    def forward(self, x_btc: torch.Tensor, observed_bt: torch.Tensor, time_bt: torch.Tensor | None = None
                ) -> torch.Tensor:
        x_bld, valid_bl = self.tokens(x_btc, observed_bt, time_bt)
        if not bool(valid_bl.any(1).all()):
            raise ValueError("a series has no observed step")
        keys_b11l = valid_bl[:, None, None, :]  # SDPA: True = may attend
        for block in self.blocks:
            x_bld = block(x_bld, attn_mask=keys_b11l)
        x_bld = self.norm(x_bld)
        weights_bl1 = valid_bl[..., None].to(x_bld.dtype)
        pooled_bd = (x_bld * weights_bl1).sum(1) / weights_bl1.sum(1)
        return self.head(pooled_bd)
