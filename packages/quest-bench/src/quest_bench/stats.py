"""Statistics for the leaderboard, right at every n (scipy for the distributions; the tests are written out here).

- ``mean_std``: the sample std needs n ≥ 2 (NaN below, shown as "—").
- Paired differences to the baseline (same seed and grid cell): the per-pair differences, an exact two-sided
  sign-flip permutation p-value (all 2^n sign patterns up to n = 16, 200,000 seeded random ones above), and for
  n ≥ 5 a t-interval of the mean difference. With fewer than 5 pairs no interval is given: a bootstrap interval of
  2–4 values is [min, max] of them and covers far less than its nominal 95%.
- ``holm``: Holm's step-down adjustment over the variants of one task.
- Binary outcomes (e.g. the spurious probe's success): ``wilson_interval`` for a rate, ``mcnemar_exact`` for a paired
  comparison.
- ``sign_test``: the exact two-sided sign test on paired wins and losses (a diverged or failed run loses), which the
  mean win rate uses so that a "win" is a significant one.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats as st

EXACT_SIGN_FLIPS = 16  # up to this many pairs, every sign pattern is enumerated
RANDOM_SIGN_FLIPS = 200_000
MIN_PAIRS_FOR_INTERVAL = 5


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); the std is NaN for fewer than 2 values."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else float("nan")


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean (NaN, NaN) for fewer than 2 values."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return float("nan"), float("nan")
    half = st.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    return float(arr.mean() - half), float(arr.mean() + half)


def sign_flip_p(diffs: list[float], seed: int = 0) -> float:
    """Two-sided paired permutation p-value of mean(diffs) = 0: the share of sign patterns whose |mean| is at least
    the observed one (1 when every difference is 0; NaN without pairs). Exact up to EXACT_SIGN_FLIPS pairs; beyond,
    RANDOM_SIGN_FLIPS random patterns and the Monte Carlo estimate (hits + 1) / (draws + 1), which is never 0."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        return float("nan")
    observed = abs(d.mean())
    exact = d.size <= EXACT_SIGN_FLIPS
    if exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(RANDOM_SIGN_FLIPS, d.size))
    means = np.abs(signs @ np.abs(d)) / d.size
    hits = int(np.sum(means >= observed - 1e-12 * max(1.0, observed)))
    return hits / len(signs) if exact else (hits + 1) / (len(signs) + 1)


def paired_difference(ours: dict, base: dict) -> dict:
    """Paired comparison over the keys both have (same seed and overrides): n_pairs, the differences (ordered by
    key), their mean, the sign-flip p-value and, for n ≥ 5, a t 95% interval (else NaN)."""
    keys = sorted(set(ours) & set(base))
    diffs = [ours[k] - base[k] for k in keys]
    lo, hi = t_interval(diffs) if len(diffs) >= MIN_PAIRS_FOR_INTERVAL else (float("nan"), float("nan"))
    return {"n_pairs": len(keys), "diffs": diffs, "mean": float(np.mean(diffs)) if diffs else float("nan"),
            "p": sign_flip_p(diffs), "ci_low": lo, "ci_high": hi}


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (NaN p-values are left out and stay NaN)."""
    finite = sorted((p, k) for k, p in pvalues.items() if math.isfinite(p))
    adjusted, running = {k: float("nan") for k in pvalues}, 0.0
    for i, (p, k) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - i) * p))
        adjusted[k] = running
    return adjusted


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (NaN, NaN for n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    z = st.norm.ppf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mcnemar_exact(ours: dict, base: dict) -> dict:
    """Exact McNemar test of paired binary outcomes (keys both have): b = ours only, c = base only,
    p = two-sided binomial(b; b + c, 1/2)."""
    keys = set(ours) & set(base)
    b = sum(bool(ours[k]) and not bool(base[k]) for k in keys)
    c = sum(bool(base[k]) and not bool(ours[k]) for k in keys)
    p = float(st.binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0
    return {"n_pairs": len(keys), "ours_only": b, "base_only": c, "p": p}


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test of paired wins vs losses (ties dropped)."""
    return float(st.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0


def min_pairs_for_significance(n_tests: int, alpha: float = 0.05) -> int:
    """The fewest paired runs with which one of ``n_tests`` Holm-corrected two-sided sign (or sign-flip) tests can
    reach ``alpha``: its smallest p-value is 2/2^n and Holm's first threshold alpha/n_tests."""
    return math.ceil(1 + math.log2(max(1, n_tests) / alpha))


def mean_win_rate(outcomes: dict[str, dict[str, dict[str, float]]], higher_is_better: dict[str, bool],
                  alpha: float = 0.05) -> dict[str, float]:
    """Mean win rate with significant wins only: per scenario (a task metric) and pair of variants, compare their
    paired runs (same seed and grid cell); a variant wins if it is better on significantly more pairs (exact sign
    test, Holm-adjusted over the scenario's pairs, at ``alpha``), otherwise the two tie (½ each). Non-finite values
    (diverged or failed runs) rank worst. Each variant's win rate is averaged over the scenarios it appears in.

    ``outcomes[scenario][variant][pair_key]`` is that run's value (``-inf``/``inf``/NaN for a run without one).
    """
    wins: dict[str, list[float]] = {}
    for scenario, by_variant in outcomes.items():
        variants = sorted(by_variant)
        if len(variants) < 2:
            continue
        sign = 1.0 if higher_is_better[scenario] else -1.0
        tests, counts = {}, {}
        for a, b in itertools.combinations(variants, 2):
            keys = set(by_variant[a]) & set(by_variant[b])
            better = sum(_rank_value(by_variant[a][k], sign) > _rank_value(by_variant[b][k], sign) for k in keys)
            worse = sum(_rank_value(by_variant[a][k], sign) < _rank_value(by_variant[b][k], sign) for k in keys)
            tests[f"{a}|{b}"], counts[(a, b)] = sign_test(better, worse), (better, worse)
        adjusted = holm(tests)
        score = {v: [] for v in variants}
        for (a, b), (better, worse) in counts.items():
            significant = adjusted[f"{a}|{b}"] < alpha
            share_a = (1.0 if better > worse else 0.0) if significant else 0.5
            score[a].append(share_a)
            score[b].append(1.0 - share_a)
        for v, shares in score.items():
            wins.setdefault(v, []).append(float(np.mean(shares)))
    return {v: float(np.mean(w)) for v, w in wins.items()}


def _rank_value(value: float, sign: float) -> float:
    """A value oriented so that larger is better; a missing or non-finite one is the worst."""
    return sign * value if value is not None and math.isfinite(value) else -math.inf
