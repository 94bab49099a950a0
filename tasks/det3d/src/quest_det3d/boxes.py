"""CenterPoint-style box coding on a bird's-eye-view grid (Yin et al. 2021), written in torch: Gaussian class
heatmaps at box centres, regression targets at the centre cells, and the inverse (peak picking and decoding);
plus the LiDAR-frame -> global-frame conversion through the devkit's ``Box``.

Boxes are rows (x, y, z, w, l, h, yaw, vx, vy) in the LiDAR frame; the regression code of a box at cell (i, j) is
(dx, dy, z, log w, log l, log h, sin yaw, cos yaw, vx, vy) with dx, dy the centre's offset inside the cell.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

CODE_SIZE = 10
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")  # stable in practice since torch 2.0


@dataclass(frozen=True)
class Grid:
    """The square BEV output grid: ``size`` x ``size`` cells of ``cell`` metres covering |x|, |y| < ``extent``."""

    extent: float
    cell: float

    @property
    def size(self) -> int:
        return round(2 * self.extent / self.cell)


def gaussian_radius(length: torch.Tensor, width: torch.Tensor, min_overlap: float = 0.1) -> torch.Tensor:
    """CenterNet's radius (in cells) within which a shifted box keeps IoU >= ``min_overlap`` (the smallest of its
    three cases), as CenterPoint uses it for box footprints of ``length`` x ``width`` cells."""
    b1, c1 = length + width, width * length * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + torch.sqrt(b1**2 - 4 * c1)) / 2
    b2, c2 = 2 * (length + width), (1 - min_overlap) * width * length
    r2 = (b2 + torch.sqrt(b2**2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * (length + width), (min_overlap - 1) * width * length
    r3 = (b3 + torch.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


@dataclass
class Targets:
    heatmap: torch.Tensor  # (B, C, S, S) in [0, 1], exactly 1 at each box's centre cell
    batch: torch.Tensor  # (K,) sample index of each box
    cell: torch.Tensor  # (K,) flat cell index i * S + j (row i along y, column j along x)
    code: torch.Tensor  # (K, CODE_SIZE) regression targets
    code_mask: torch.Tensor  # (K, CODE_SIZE) 0 where a target is unknown (velocity NaN)

    def to(self, device) -> "Targets":
        return Targets(*(getattr(self, f.name).to(device) for f in fields(self)))


def encode(boxes: list[torch.Tensor], labels: list[torch.Tensor], num_classes: int, grid: Grid,
           min_radius: int = 2) -> Targets:
    """Heatmaps and regression targets of a batch; boxes whose centre lies outside the grid are left out."""
    s = grid.size
    heat = torch.zeros(len(boxes) * num_classes, s * s)
    batch, cells, codes, classes = [], [], [], []
    ys, xs = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
    for b, (box, label) in enumerate(zip(boxes, labels)):
        u, v = (box[:, 0] + grid.extent) / grid.cell, (box[:, 1] + grid.extent) / grid.cell
        inside = (u >= 0) & (u < s) & (v >= 0) & (v < s)
        box, label, u, v = box[inside], label[inside], u[inside], v[inside]
        j, i = u.floor().long(), v.floor().long()
        radius = gaussian_radius(box[:, 4] / grid.cell, box[:, 3] / grid.cell).floor().clamp(min=min_radius)
        sigma = (2 * radius + 1) / 6
        dist2 = (xs[None] - j[:, None, None]) ** 2 + (ys[None] - i[:, None, None]) ** 2  # (M, S, S)
        near = torch.maximum((xs[None] - j[:, None, None]).abs(), (ys[None] - i[:, None, None]).abs()) <= radius[:, None, None]
        gauss = torch.exp(-dist2 / (2 * sigma[:, None, None] ** 2)) * near
        heat.index_reduce_(0, b * num_classes + label, gauss.flatten(1), "amax")
        code = torch.cat([(u - j)[:, None], (v - i)[:, None], box[:, 2:3], box[:, 3:6].log(),
                          box[:, 6:7].sin(), box[:, 6:7].cos(), box[:, 7:9]], 1)
        batch.append(torch.full_like(i, b))
        cells.append(i * s + j)
        codes.append(code)
        classes.append(label)
    code = torch.cat(codes)
    return Targets(heat.view(len(boxes), num_classes, s, s), torch.cat(batch), torch.cat(cells),
                   torch.nan_to_num(code), (~code.isnan()).float())


def focal_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), normalised by the number of centres."""
    pred = torch.sigmoid(logits.float()).clamp(1e-4, 1 - 1e-4)
    positive = target.eq(1).float()
    pos = torch.log(pred) * (1 - pred) ** 2 * positive
    neg = torch.log(1 - pred) * pred**2 * (1 - target) ** 4 * (1 - positive)
    return -(pos.sum() + neg.sum()) / positive.sum().clamp(min=1)


def regression_loss(code_pred: torch.Tensor, targets: Targets, velocity_weight: float = 0.2) -> torch.Tensor:
    """L1 between the predicted code maps (B, CODE_SIZE, S, S) at the box centres and the targets, weight 1 per
    code entry except ``velocity_weight`` for the velocity (CenterPoint's nuScenes weights use 0.2)."""
    picked = code_pred.flatten(2)[targets.batch, :, targets.cell]  # (K, CODE_SIZE)
    weights = torch.tensor([1.0] * 8 + [velocity_weight] * 2, device=picked.device) * targets.code_mask
    return (weights * (picked.float() - targets.code).abs()).sum() / max(1, len(targets.cell))


@torch.no_grad()
def decode(heat_logits: torch.Tensor, code_pred: torch.Tensor, grid: Grid, top_k: int = 100):
    """Per sample, the ``top_k`` local maxima (3x3) of the heatmaps as (boxes (k, 9), scores (k,), labels (k,))."""
    b, c, s, _ = heat_logits.shape
    heat = torch.sigmoid(heat_logits.float())
    heat = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    scores, index = heat.flatten(1).topk(min(top_k, c * s * s))
    label, cell = index // (s * s), index % (s * s)
    code = torch.gather(code_pred.float().flatten(2), 2, cell[:, None].expand(-1, CODE_SIZE, -1)).transpose(1, 2)
    i, j = cell // s, cell % s
    x = (j + code[..., 0]) * grid.cell - grid.extent
    y = (i + code[..., 1]) * grid.cell - grid.extent
    boxes = torch.stack([x, y, code[..., 2], *code[..., 3:6].clamp(max=4).exp().unbind(-1),
                         torch.atan2(code[..., 6], code[..., 7]), code[..., 8], code[..., 9]], -1)
    return [(boxes[n].cpu(), scores[n].cpu(), label[n].cpu()) for n in range(b)]


def to_global(box_row: np.ndarray, lidar_to_ego: dict, ego_to_global: dict):
    """One LiDAR-frame box row as a devkit ``Box`` in the global frame (the chain the devkit uses for GT)."""
    from nuscenes.utils.data_classes import Box
    from pyquaternion import Quaternion

    x, y, z, w, l, h, yaw, vx, vy = (float(v) for v in box_row)
    box = Box([x, y, z], [w, l, h], Quaternion(axis=[0, 0, 1], angle=yaw), velocity=(vx, vy, 0.0))
    box.rotate(Quaternion(lidar_to_ego["rotation"]))
    box.translate(np.array(lidar_to_ego["translation"]))
    box.rotate(Quaternion(ego_to_global["rotation"]))
    box.translate(np.array(ego_to_global["translation"]))
    return box
