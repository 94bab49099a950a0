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
- The decision rule (``decide``, docs/statistics.md): with n ≥ 10 pairs the paired t test decides, Holm-corrected over
  every comparison given (a page's variants × tasks); the interval shown is the t interval at the level that Holm
  gives the comparison, so that mark, interval and words agree; the exact sign-flip p is a robustness check; every
  comparison carries its minimum detectable effect (``mde_paired_t``) at 80% power.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats as st
from scipy.optimize import brentq

EXACT_SIGN_FLIPS = 16  # up to this many pairs, every sign pattern is enumerated
RANDOM_SIGN_FLIPS = 200_000
MIN_PAIRS_FOR_INTERVAL = 5
ALPHA = 0.05  # the decision rule's two-sided level
POWER = 0.80  # the power at which a minimum detectable effect is stated
MIN_PAIRS_FOR_VERDICT = 10  # fewer pairs get no verdict


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
            "p": sign_flip_p(diffs), "p_floor": monte_carlo_floor(len(diffs)), "ci_low": lo, "ci_high": hi}


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


# ---- the decision rule ------------------------------------------------------------------------------------------

def monte_carlo_floor(n: int) -> float | None:
    """The smallest p-value ``sign_flip_p`` can return for ``n`` pairs when it samples sign patterns
    (1 / (RANDOM_SIGN_FLIPS + 1)); None when it enumerates them (its p is then exact)."""
    return None if n <= EXACT_SIGN_FLIPS else 1.0 / (RANDOM_SIGN_FLIPS + 1)


def format_p(p: float, floor: float | None = None) -> str:
    """A p-value as text: "p = 0.012"; "p ≤ 5e-06" when it sits at a Monte-Carlo ``floor`` (it is an upper bound
    there, not an estimate); "p = —" when there is none."""
    if p is None or not math.isfinite(p):
        return "p = —"
    if floor is not None and p <= floor * (1 + 1e-9):
        return f"p ≤ {floor:.2g}"
    return f"p = {p:.2g}"


def paired_t(diffs: list[float], level: float = 0.95) -> dict:
    """The paired (one-sample) t test of mean(diffs) = 0 and its t interval at ``level`` (scipy's ``ttest_1samp``):
    n, mean, sd (ddof=1), p (two-sided), ci_low, ci_high. Fewer than 2 differences: NaN. Identical differences
    (sd = 0): p = 1 if they are 0, else 0, and the interval is the point."""
    d = np.asarray(diffs, dtype=float)
    nan = float("nan")
    if d.size < 2:
        return {"n": int(d.size), "mean": float(d.mean()) if d.size else nan, "sd": nan, "p": nan,
                "ci_low": nan, "ci_high": nan}
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return {"n": int(d.size), "mean": mean, "sd": 0.0, "p": 1.0 if mean == 0.0 else 0.0, "ci_low": mean,
                "ci_high": mean}
    res = st.ttest_1samp(d, 0.0)
    ci = res.confidence_interval(level)
    return {"n": int(d.size), "mean": mean, "sd": sd, "p": float(res.pvalue), "ci_low": float(ci.low),
            "ci_high": float(ci.high)}


def power_paired_t(effect_z: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t test at ``alpha`` with ``n`` pairs when the true standardised effect
    (mean difference / sd of the differences) is ``effect_z``: the noncentral t (df = n − 1, noncentrality
    effect_z·√n) beyond ±t(1 − alpha/2, n − 1)."""
    df = n - 1
    crit = st.t.ppf(1 - alpha / 2, df)
    nc = effect_z * math.sqrt(n)
    # the lower tail as sf(crit; −nc), by symmetry: scipy's nct.cdf is NaN far in the tail where sf is 0
    return float(st.nct.sf(crit, df, nc) + st.nct.sf(crit, df, -nc))


def mde_paired_t(n: int, sd: float = 1.0, alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimum detectable effect: the smallest true mean difference that the two-sided paired t test at
    ``alpha`` detects with probability ``power`` with ``n`` pairs whose differences have standard deviation ``sd``
    (in the metric's units; sd = 1 gives it in sd units). NaN for n < 2 or a non-finite sd."""
    if n < 2 or sd is None or not math.isfinite(sd):
        return float("nan")
    if not 0 < alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    high = 1.0
    while power_paired_t(high, n, alpha) < power:  # power grows with the effect: bracket the root
        high *= 2
    effect_z = brentq(lambda x: power_paired_t(x, n, alpha) - power, 0.0, high, xtol=1e-10)
    return float(effect_z * sd)


def decide(diffs: dict, higher_is_better: dict | None = None, margins: dict | None = None, alpha: float = ALPHA,
           power: float = POWER, min_pairs: int = MIN_PAIRS_FOR_VERDICT) -> dict:
    """The pre-declared decision rule over every comparison on a page (docs/statistics.md).

    ``diffs[key]``: a comparison's paired differences (ours − baseline); ``higher_is_better[key]`` (default True)
    orients "better"; ``margins[key]``: a declared equivalence margin in the metric's units (optional). A comparison
    with at least ``min_pairs`` pairs is decided by the paired t test, its p Holm-corrected over all such
    comparisons; fewer pairs get no verdict (and stay out of the correction). The interval shown is the t interval
    at confidence 1 − alpha·p/p_Holm (95% where Holm leaves p as it is, at most the Bonferroni 1 − alpha/m), which
    excludes 0 exactly when p_Holm < alpha: the mark, the interval and the words come from the same test.

    Returns, per key: n, mean, sd, p (t), p_holm, level, ci_low, ci_high, p_sign_flip and sign_flip_floor (the
    robustness check), mde (at ``power``, two-sided ``alpha``, in the metric's units), margin, verdict
    ("better", "worse", "equivalent", "within" or "no verdict"), mark ("*" when significant) and words.
    """
    higher_is_better, margins = higher_is_better or {}, margins or {}
    tests = {key: paired_t(d) for key, d in diffs.items()}
    family = {k: t["p"] for k, t in tests.items() if t["n"] >= min_pairs and math.isfinite(t["p"])}
    adjusted = holm(family)
    out = {}
    for key, t in tests.items():
        n, p, p_holm = t["n"], t["p"], adjusted.get(key, float("nan"))
        decided = key in family
        level = 1 - alpha * p / p_holm if decided and p_holm > 0 else 1 - alpha
        lo, hi = (paired_t(diffs[key], level)[k] for k in ("ci_low", "ci_high")) if n >= 2 else (t["ci_low"],) * 2
        margin = margins.get(key)
        significant = decided and p_holm < alpha
        sign = 1.0 if higher_is_better.get(key, True) else -1.0
        if not decided:
            verdict = "no verdict"
        elif significant:
            verdict = "better" if sign * t["mean"] > 0 else "worse"
        elif margin is not None and -margin <= lo and hi <= margin:
            verdict = "equivalent"
        else:
            verdict = "within"
        out[key] = {"n": n, "mean": t["mean"], "sd": t["sd"], "p": p, "p_holm": p_holm, "level": level,
                    "ci_low": lo, "ci_high": hi, "p_sign_flip": sign_flip_p(diffs[key]),
                    "sign_flip_floor": monte_carlo_floor(n), "mde": mde_paired_t(n, t["sd"], alpha, power),
                    "margin": margin, "verdict": verdict, "mark": "*" if significant else "",
                    "words": verdict_words(verdict, t["mean"], lo, hi, level, n, min_pairs, margin)}
    return out


def verdict_words(verdict: str, mean: float, lo: float, hi: float, level: float, n: int, min_pairs: int,
                  margin: float | None) -> str:
    """The sentence a verdict is stated in; a non-significant result is never "no difference"."""
    interval = f"[{lo:+.3g}, {hi:+.3g}]" if math.isfinite(lo) else "(no interval)"
    at = f" ({100 * level:.3g}% t interval)" if math.isfinite(lo) else ""
    if verdict == "no verdict":
        return f"no verdict: n = {n} < {min_pairs} pairs; Δ {mean:+.3g} within {interval}{at}"
    if verdict in ("better", "worse"):
        return f"{verdict}: Δ {mean:+.3g} {interval}{at}"
    if verdict == "equivalent":
        return f"equivalent within ±{margin:.3g}: Δ {mean:+.3g} {interval}{at}"
    return f"not significant: Δ {mean:+.3g} within {interval}{at}"
