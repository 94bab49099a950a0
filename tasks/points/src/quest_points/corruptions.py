"""Point-cloud corruptions in the ModelNet-C families (Ren, Pan & Liu 2022, "Benchmarking and Analyzing Point
Cloud Classification under Corruptions"), 5 severities each, on batches of unit-sphere clouds (B, N, 3).

Written by hand (ModelNet-C ships pre-corrupted files, not a library). The severity parameters follow the paper's
definitions as we read them; they are not byte-identical to its released data:

    jitter          Gaussian noise on every coordinate, σ = 0.01 .. 0.05
    scale           per-axis scale factors from U(1/s, s), s = 1.6 .. 2.0, then back into the unit sphere
    rotate          rotation about each axis by U(-θ, θ), θ = 15° .. 75° (the ModelNet-C paper uses 5 values too)
    dropout_global  drop a random 25 % .. 75 % of the points
    dropout_local   drop 100 .. 500 points (per 1,024) in 1..8 local clusters around random centres
    add_global      add 10 .. 50 outlier points (per 1,024) uniformly in the unit ball
    add_local       add 100 .. 500 points (per 1,024) in 1..8 small Gaussian clusters on the surface

Every cloud of a batch keeps the same number of points. Deterministic given ``seed``.
"""

from __future__ import annotations

import math

import torch

from quest_sdk.robustness import check_corruption

SEVERITIES = (1, 2, 3, 4, 5)
CORRUPTIONS = ("jitter", "scale", "rotate", "dropout_global", "dropout_local", "add_global", "add_local")


def corrupt(x_bn3: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    """A corrupted copy of a batch of clouds."""
    check_corruption(name, severity, CORRUPTIONS, SEVERITIES)
    gen = torch.Generator().manual_seed(seed)
    x = x_bn3.float().cpu()
    return _FUNCTIONS[name](x, severity - 1, gen).to(x_bn3.device, x_bn3.dtype)


def _uniform(shape, low, high, gen) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=gen)


def _jitter(x, level, gen):
    return x + torch.randn(x.shape, generator=gen) * (0.01 * (level + 1))


def _scale(x, level, gen):
    s = (1.6, 1.7, 1.8, 1.9, 2.0)[level]
    factors = torch.exp(_uniform((x.shape[0], 1, 3), -math.log(s), math.log(s), gen))
    y = x * factors
    return y / y.norm(dim=-1).amax(1).clamp_min(1e-9)[:, None, None]


def _rotate(x, level, gen):
    theta = math.radians((15, 30, 45, 60, 75)[level])
    angles = _uniform((x.shape[0], 3), -theta, theta, gen)
    c, s = angles.cos(), angles.sin()
    one, zero = torch.ones_like(c[:, 0]), torch.zeros_like(c[:, 0])
    rx = torch.stack([one, zero, zero, zero, c[:, 0], -s[:, 0], zero, s[:, 0], c[:, 0]], -1).view(-1, 3, 3)
    ry = torch.stack([c[:, 1], zero, s[:, 1], zero, one, zero, -s[:, 1], zero, c[:, 1]], -1).view(-1, 3, 3)
    rz = torch.stack([c[:, 2], -s[:, 2], zero, s[:, 2], c[:, 2], zero, zero, zero, one], -1).view(-1, 3, 3)
    return x @ (rz @ ry @ rx).transpose(1, 2)


def _dropout_global(x, level, gen):
    keep = round(x.shape[1] * (1 - (0.25, 0.375, 0.5, 0.625, 0.75)[level]))
    order = torch.rand(x.shape[:2], generator=gen).argsort(1)[:, :keep]
    return torch.gather(x, 1, order[..., None].expand(-1, -1, 3))


def _dropout_local(x, level, gen):
    b, n, _ = x.shape
    total = round(n * 100 * (level + 1) / 1024)
    drop = torch.zeros(b, n, dtype=torch.bool)
    for i in range(b):
        clusters = int(torch.randint(1, 9, (1,), generator=gen))
        sizes = torch.full((clusters,), total // clusters)
        sizes[: total % clusters] += 1
        for size in sizes.tolist():
            alive = (~drop[i]).nonzero().flatten()
            centre = x[i, alive[torch.randint(len(alive), (1,), generator=gen)]]
            dist = (x[i, alive] - centre).norm(dim=-1)
            drop[i, alive[dist.topk(min(size, len(alive)), largest=False).indices]] = True
    return torch.stack([x[i, ~drop[i]] for i in range(b)])


def _add_global(x, level, gen):
    b, n, _ = x.shape
    count = round(n * 10 * (level + 1) / 1024)
    direction = torch.randn((b, count, 3), generator=gen)
    radius = torch.rand((b, count, 1), generator=gen) ** (1 / 3)
    return torch.cat([x, direction / direction.norm(dim=-1, keepdim=True) * radius], 1)


def _add_local(x, level, gen):
    b, n, _ = x.shape
    total = round(n * 100 * (level + 1) / 1024)
    added = []
    for i in range(b):
        clusters = int(torch.randint(1, 9, (1,), generator=gen))
        centres = x[i, torch.randint(n, (clusters,), generator=gen)]
        which = torch.randint(clusters, (total,), generator=gen)
        sigma = _uniform((clusters, 1), 0.075, 0.125, gen)
        added.append(centres[which] + torch.randn((total, 3), generator=gen) * sigma[which])
    return torch.cat([x, torch.stack(added)], 1)


_FUNCTIONS = {"jitter": _jitter, "scale": _scale, "rotate": _rotate, "dropout_global": _dropout_global,
              "dropout_local": _dropout_local, "add_global": _add_global, "add_local": _add_local}
