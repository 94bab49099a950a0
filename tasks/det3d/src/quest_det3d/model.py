"""The detector: pillars -> BEV CNN -> a transformer over BEV tokens (quest-core attention) -> CenterPoint head.

- ``PillarEncoder``: PointPillars' idea (Lang et al. 2019) in pure torch: each point's features (position,
  intensity, time lag, offset from its pillar centre) go through a shared MLP and are max-pooled per pillar with
  ``scatter_reduce`` (no compiled voxelization op).
- ``BevTransformer``: global self-attention over the stride-8 BEV tokens, pre-norm blocks whose attention is a
  quest-core ``SelfAttention`` of the chosen variant (the part that differs between variants).
- ``CenterHead``: a class heatmap and the regression code of ``quest_det3d.boxes`` at stride 2.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from quest_core import SelfAttention
from quest_det3d.boxes import CODE_SIZE, Grid

warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")  # stable in practice since torch 2.0
POINT_FEATURES = 9  # x, y, z, intensity, time lag, offset x/y from the pillar centre, z - the pillar's mean z, mean z


def conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class PillarEncoder(nn.Module):
    """Points (a list of (N_b, >= 6) clouds: x, y, z, intensity, time lag, sweep index, ...) -> pillar features
    (B, width, P, P) on a grid of ``pillar`` metres; points outside the grid are ignored.

    Each sweep is pooled into its own pillar features and the sweeps are stacked as channels (the early fusion of
    Fast and Furious, Luo et al. 2018), so that motion (the shift between sweeps) is visible to the first layer.
    """

    def __init__(self, extent: float, pillar: float, width: int, sweeps: int, point_width: int = 16):
        super().__init__()
        self.grid, self.sweeps = Grid(extent, pillar), sweeps
        self.point_mlp = nn.Sequential(nn.Linear(POINT_FEATURES, point_width), nn.ReLU(inplace=True))
        self.pillar_mlp = nn.Sequential(nn.Conv2d(sweeps * point_width, width, 1, bias=False), nn.BatchNorm2d(width),
                                        nn.ReLU(inplace=True))

    def forward(self, clouds: list[torch.Tensor]) -> torch.Tensor:
        g, p = self.grid, self.grid.size
        pts = torch.cat(clouds)  # (N, 7)
        batch = torch.cat([torch.full((len(c),), b, device=pts.device) for b, c in enumerate(clouds)])
        col = ((pts[:, 0] + g.extent) / g.cell).floor().long()
        row = ((pts[:, 1] + g.extent) / g.cell).floor().long()
        inside = (col >= 0) & (col < p) & (row >= 0) & (row < p)
        pts, batch, col, row = pts[inside], batch[inside], col[inside], row[inside]
        sweep = pts[:, 5].long().clamp(0, self.sweeps - 1)
        pillar = ((batch * self.sweeps + sweep) * p + row) * p + col  # (N,)
        count = torch.zeros(len(clouds) * self.sweeps * p * p, device=pts.device).index_add_(0, pillar, torch.ones_like(pts[:, 2]))
        mean_z = torch.zeros_like(count).index_add_(0, pillar, pts[:, 2]) / count.clamp(min=1)
        feats = torch.stack([
            pts[:, 0] / g.extent, pts[:, 1] / g.extent, pts[:, 2] / 4, pts[:, 3] / 255, pts[:, 4] * 2,
            ((pts[:, 0] + g.extent) / g.cell - col - 0.5), ((pts[:, 1] + g.extent) / g.cell - row - 0.5),
            pts[:, 2] - mean_z[pillar], mean_z[pillar] / 4], 1)
        per_point = self.point_mlp(feats)
        out = torch.zeros(len(count), per_point.shape[1], device=pts.device, dtype=per_point.dtype)
        out.index_reduce_(0, pillar, per_point, "amax", include_self=True)  # ReLU outputs >= 0: empty pillars stay 0
        out = out.view(len(clouds), self.sweeps, p, p, -1).permute(0, 1, 4, 2, 3).flatten(1, 2)  # (B, S*C, P, P)
        return self.pillar_mlp(out)


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(LN(x)); x + MLP(LN(x))."""

    def __init__(self, dim: int, num_heads: int, variant: str, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, variant=variant)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x_bld: torch.Tensor) -> torch.Tensor:
        x_bld = x_bld + self.attn(self.norm1(x_bld))
        return x_bld + self.mlp(self.norm2(x_bld))


class BevTransformer(nn.Module):
    """Global self-attention over an (B, dim, T, T) token map, with a learned position embedding."""

    def __init__(self, dim: int, tokens_per_side: int, depth: int, num_heads: int, variant: str):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.randn(1, tokens_per_side**2, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, num_heads, variant) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}

    def forward(self, x_bdtt: torch.Tensor) -> torch.Tensor:
        b, d, t, _ = x_bdtt.shape
        x_bld = x_bdtt.flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x_bld = block(x_bld)
        return self.norm(x_bld).transpose(1, 2).reshape(b, d, t, t)


class CenterHead(nn.Module):
    def __init__(self, c_in: int, num_classes: int):
        super().__init__()
        self.shared = conv_bn(c_in, c_in)
        self.heatmap = nn.Sequential(conv_bn(c_in, c_in), nn.Conv2d(c_in, num_classes, 1))
        self.code = nn.Sequential(conv_bn(c_in, c_in), nn.Conv2d(c_in, CODE_SIZE, 1))
        nn.init.constant_(self.heatmap[-1].bias, -2.19)  # CenterPoint's prior: sigmoid(-2.19) = 0.1

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.shared(x)
        return self.heatmap(x), self.code(x)


class Detector(nn.Module):
    """Clouds -> (heatmap logits (B, C, S, S), code maps (B, CODE_SIZE, S, S)) on ``self.grid`` (stride 2).

    A small U-shaped BEV network: stride 2 (``width``), stride 4 (``2 * width``), stride 8 (``dim``, the
    transformer's tokens), then upsampling with skip connections back to stride 2 for the head.
    """

    def __init__(self, num_classes: int, variant: str, sweeps: int, extent: float = 32.0, pillar: float = 0.5,
                 pillar_width: int = 32, width: int = 32, dim: int = 64, depth: int = 2, num_heads: int = 4):
        super().__init__()
        self.pillars = PillarEncoder(extent, pillar, pillar_width, sweeps)
        p = self.pillars.grid.size
        if abs(p * pillar - 2 * extent) > 1e-6 or p % 8:
            raise ValueError(f"2 * extent / pillar = {2 * extent / pillar:g} pillars: it must be a whole number "
                             f"divisible by 8 (e.g. extent 32, pillar 0.5)")
        self.grid = Grid(extent, 2 * pillar)
        self.down2 = nn.Sequential(conv_bn(pillar_width, width, 2), conv_bn(width, width))
        self.down4 = nn.Sequential(conv_bn(width, 2 * width, 2), conv_bn(2 * width, 2 * width))
        self.down8 = conv_bn(2 * width, dim, 2)
        self.transformer = BevTransformer(dim, p // 8, depth, num_heads, variant)
        self.up4, self.fuse4 = upsample(dim, 2 * width), conv_bn(4 * width, 2 * width)
        self.up2, self.fuse2 = upsample(2 * width, width), conv_bn(2 * width, width)
        self.head = CenterHead(width, num_classes)

    def forward(self, clouds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = self.down2(self.pillars(clouds))
        x4 = self.down4(x2)
        x8 = self.transformer(self.down8(x4))  # the attention
        x4 = self.fuse4(torch.cat([x4, self.up4(x8)], 1))
        return self.head(self.fuse2(torch.cat([x2, self.up2(x4)], 1)))


def upsample(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.ConvTranspose2d(c_in, c_out, 2, 2, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(True))
