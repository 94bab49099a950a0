"""Time-series corruptions, 5 severities each, on standardised padded batches: values (N, T, C) and observed steps
(N, T). Written by hand (no library ships these for padded multivariate batches); each acts on every series' own
observed steps and leaves padding as it is:

    gaussian_noise  additive N(0, σ²) on every observed value, σ = 0.25, 0.5, 0.75, 1, 1.5 (standardised units)
    missing         a random 20, 40, 60, 75, 90 % of each series' observed steps become unobserved (at least one stays):
                    the model sees them through its mask as missing, the other steps keep their times
    time_warp       a smooth monotone random warp of the time axis, resampled by linear interpolation: the
                    local speed is exp(σ · g) with g a piecewise-linear Gaussian curve through 5 knots,
                    σ = 0.25, 0.5, 1, 1.5, 2; the first and last steps stay in place
    scaling         every channel of every series multiplied by a factor log-uniform in [1/s, s],
                    s = 1.5, 2, 3, 4, 6

Deterministic given ``seed``; with one seed the severities share their random draws, so a higher severity is the
same corruption made stronger.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from quest_sdk.robustness import check_corruption

SEVERITIES = (1, 2, 3, 4, 5)
CORRUPTIONS = ("gaussian_noise", "missing", "time_warp", "scaling")

NOISE_SIGMA = (0.25, 0.5, 0.75, 1.0, 1.5)
MISSING_FRACTION = (0.2, 0.4, 0.6, 0.75, 0.9)
WARP_SIGMA = (0.25, 0.5, 1.0, 1.5, 2.0)
WARP_KNOTS = 5
SCALE_LIMIT = (1.5, 2.0, 3.0, 4.0, 6.0)


def corrupt(x_ntc: torch.Tensor, observed_nt: torch.Tensor, name: str, severity: int, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """A corrupted copy of a batch: (values, observed steps)."""
    check_corruption(name, severity, CORRUPTIONS, SEVERITIES)
    gen = torch.Generator().manual_seed(seed)
    x, observed = x_ntc.float().cpu().clone(), observed_nt.cpu().clone()
    x, observed = _FUNCTIONS[name](x, observed, severity - 1, gen)
    x = torch.where(observed[..., None], x, 0.0)
    return x.to(x_ntc.device, x_ntc.dtype), observed.to(observed_nt.device)


def _gaussian_noise(x, observed, level, gen):
    return x + NOISE_SIGMA[level] * torch.randn(x.shape, generator=gen), observed


def _missing(x, observed, level, gen):
    score = torch.rand(observed.shape, generator=gen).masked_fill(~observed, math.inf)
    order = score.argsort(1)  # observed steps first, in random order
    count = observed.sum(1)
    drop = torch.minimum((MISSING_FRACTION[level] * count).round().long(), count - 1)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(observed.shape[1]).expand_as(order))
    return x, observed & (rank >= drop[:, None])


def _time_warp(x, observed, level, gen):
    knots = torch.randn((len(x), WARP_KNOTS), generator=gen).numpy()
    out = x.clone()
    for i in range(len(x)):
        steps = observed[i].nonzero().flatten().numpy()  # a series' observed steps, warped as one sequence
        n = len(steps)
        if n < 2:
            continue
        grid = np.linspace(0, 1, n)
        speed = np.exp(WARP_SIGMA[level] * np.interp(grid, np.linspace(0, 1, WARP_KNOTS), knots[i]))
        warp = np.concatenate([[0.0], np.cumsum((speed[1:] + speed[:-1]) / 2)])  # monotone, 0 .. total
        source = warp / warp[-1] * (n - 1)  # where in the original each output step is read
        values = x[i, steps].numpy()
        out[i, steps] = torch.from_numpy(np.stack([np.interp(source, np.arange(n), values[:, c])
                                                   for c in range(values.shape[1])], -1)).float()
    return out, observed


def _scaling(x, observed, level, gen):
    log_s = math.log(SCALE_LIMIT[level])
    factors = torch.exp((2 * torch.rand((x.shape[0], 1, x.shape[2]), generator=gen) - 1) * log_s)
    return x * factors, observed


_FUNCTIONS = {"gaussian_noise": _gaussian_noise, "missing": _missing, "time_warp": _time_warp,
              "scaling": _scaling}
