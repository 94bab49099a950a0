"""Statistics for the leaderboard: mean ± std, paired bootstrap intervals, HELM-style mean win rate."""

from __future__ import annotations

import numpy as np

BOOTSTRAP_SAMPLES = 2000


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def bootstrap_ci(values: list[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the values with replacement)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(BOOTSTRAP_SAMPLES, arr.size))].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def paired_difference(ours: dict, base: dict) -> dict:
    """Mean of (ours − base) over the keys both have (same seed and overrides), with a bootstrap 95% interval."""
    keys = sorted(set(ours) & set(base))
    diffs = [ours[k] - base[k] for k in keys]
    lo, hi = bootstrap_ci(diffs)
    return {"n_pairs": len(keys), "mean": float(np.mean(diffs)) if diffs else float("nan"), "ci_low": lo, "ci_high": hi}


def mean_win_rate(scores: dict[str, dict[str, float]], higher_is_better: dict[str, bool]) -> dict[str, float]:
    """HELM's mean win rate: per scenario (task metric), the fraction of other variants a variant beats
    (ties count half), averaged over the scenarios where it has a score and at least one rival does.

    ``scores[scenario][variant]`` is the variant's mean on that scenario.
    """
    wins: dict[str, list[float]] = {}
    for scenario, by_variant in scores.items():
        finite = {v: s for v, s in by_variant.items() if np.isfinite(s)}
        if len(finite) < 2:
            continue
        sign = 1.0 if higher_is_better[scenario] else -1.0
        for v, s in finite.items():
            rivals = [sign * (s - t) for u, t in finite.items() if u != v]
            wins.setdefault(v, []).append(sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in rivals) / len(rivals))
    return {v: float(np.mean(w)) for v, w in wins.items()}
