"""LiDAR corruptions in the style of Robo3D (Kong et al. 2023), hand-written in numpy (Robo3D ships datasets,
not a library): six families x three severities, deterministic given the seed, applied to a sample's accumulated
cloud (N, 7) = x, y, z, intensity, time lag, sweep index, ring in the key frame's LiDAR frame (the sensor at the
origin). Range- and angle-based corruptions treat every point as seen from the key frame's sensor position; for
the earlier sweeps (ego-motion compensated, measured up to ~5 m away) that is an approximation.

- ``beam_missing``: 30 / 50 / 70 % of the 32 laser rings removed (the ring each point was measured by).
- ``point_dropout``: 25 / 50 / 75 % of the returns lost at random.
- ``range_noise``: Gaussian noise along each ray, sigma 0.05 / 0.1 / 0.2 m.
- ``fog``: two-way transmittance exp(-2 beta r), beta = 0.005 / 0.01 / 0.02 per m: a return is kept with that
  probability and dimmed by it; 30 % of the lost rays return back-scatter from 1-10 m instead.
- ``crosstalk``: 2 / 5 / 10 % extra outlier points from another sensor: random rays, range 1-40 m (never below the
  ground, taken 1.84 m under the sensor as on nuScenes' LIDAR_TOP), dim.
- ``motion_blur``: the ego motion during one 0.05 s turn is left uncompensated (rolling shutter): a point measured
  a time dt before the end of the turn appears dt x speed farther ahead, at 10 / 20 / 30 m/s.
"""

from __future__ import annotations

import numpy as np

from quest_sdk.robustness import check_corruption

SEVERITIES = (1, 2, 3)
BEAM_MISSING = (0.3, 0.5, 0.7)
POINT_DROPOUT = (0.25, 0.5, 0.75)
RANGE_NOISE = (0.05, 0.1, 0.2)
FOG_BETA = (0.005, 0.01, 0.02)
CROSSTALK = (0.02, 0.05, 0.10)
BLUR_SPEED = (10.0, 20.0, 30.0)
ELEVATION_RANGE_DEG = (-30.67, 10.67)
RINGS = 32
SENSOR_HEIGHT = 1.84  # m above the ground


def _along_rays(points: np.ndarray, new_range: np.ndarray) -> np.ndarray:
    out = points.copy()
    r = np.linalg.norm(points[:, :3], axis=1, keepdims=True).clip(min=1e-6)
    out[:, :3] = points[:, :3] / r * new_range[:, None]
    return out


def beam_missing(p, s, rng, forward_xy):
    dropped = rng.choice(RINGS, round(BEAM_MISSING[s - 1] * RINGS), replace=False)
    return p[~np.isin(p[:, 6].astype(int), dropped)]


def point_dropout(p, s, rng, forward_xy):
    return p[rng.random(len(p)) >= POINT_DROPOUT[s - 1]]


def range_noise(p, s, rng, forward_xy):
    r = np.linalg.norm(p[:, :3], axis=1)
    return _along_rays(p, np.maximum(0.1, r + rng.normal(0, RANGE_NOISE[s - 1], len(p))))


def fog(p, s, rng, forward_xy):
    r = np.linalg.norm(p[:, :3], axis=1)
    transmittance = np.exp(-2 * FOG_BETA[s - 1] * r)
    kept = rng.random(len(p)) < transmittance
    out = p[kept].copy()
    out[:, 3] *= transmittance[kept]
    lost = p[~kept]
    scatter = lost[rng.random(len(lost)) < 0.3]
    scatter = _along_rays(scatter, rng.uniform(1, 10, len(scatter)))
    scatter[:, 3] = rng.uniform(0, 20, len(scatter))
    return np.concatenate([out, scatter])


def crosstalk(p, s, rng, forward_xy):
    n = round(CROSSTALK[s - 1] * len(p))
    azimuth = rng.uniform(-np.pi, np.pi, n)
    elevation = np.radians(rng.uniform(*ELEVATION_RANGE_DEG, n))
    below = np.where(elevation < 0, SENSOR_HEIGHT / np.maximum(1e-6, np.sin(-elevation)), np.inf)  # to the ground
    r = rng.uniform(0, 1, n) * (np.minimum(40, below) - 1) + 1
    extra = np.zeros((n, p.shape[1]), p.dtype)
    extra[:, 0] = r * np.cos(elevation) * np.cos(azimuth)
    extra[:, 1] = r * np.cos(elevation) * np.sin(azimuth)
    extra[:, 2] = r * np.sin(elevation)
    extra[:, 3] = rng.uniform(0, 30, n)
    if len(p):
        extra[:, 4:] = p[rng.integers(0, len(p), n), 4:]  # the time lag, sweep and ring of a random real point
    return np.concatenate([p, extra])


def motion_blur(p, s, rng, forward_xy):
    start = rng.uniform(-np.pi, np.pi)  # the azimuth where the turn starts
    fraction = ((np.arctan2(p[:, 1], p[:, 0]) - start) % (2 * np.pi)) / (2 * np.pi)
    shift = BLUR_SPEED[s - 1] * 0.05 * (1 - fraction)  # seen from where the sensor was, (1 - fraction) turns ago
    out = p.copy()
    out[:, 0] += shift * forward_xy[0]
    out[:, 1] += shift * forward_xy[1]
    return out


CORRUPTIONS = {f.__name__: f for f in (beam_missing, point_dropout, range_noise, fog, crosstalk, motion_blur)}


def corrupt(points: np.ndarray, name: str, severity: int, seed: int, forward_xy=(0.0, 1.0)) -> np.ndarray:
    """``points`` (N, 7) with corruption ``name`` at ``severity`` (1-3); the same seed gives the same result."""
    check_corruption(name, severity, CORRUPTIONS, SEVERITIES)
    out = CORRUPTIONS[name](points, severity, np.random.default_rng(seed), np.asarray(forward_xy, float))
    return out.astype(points.dtype, copy=False)
