"""The leaderboard's statistics on hand-computed cases: n = 1, 2, 3, 10, ties, lower-is-better, diverged runs."""

import math

import pytest

from quest_bench.stats import (holm, mcnemar_exact, mean_std, mean_win_rate, paired_difference, sign_flip_p,
                               t_interval, wilson_interval)


def test_no_std_or_interval_below_two_values():
    assert mean_std([4.0])[0] == 4.0 and math.isnan(mean_std([4.0])[1])
    assert all(math.isnan(x) for x in t_interval([4.0]))
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)


def test_t_interval_by_hand():
    # n = 3, mean 2, s = 1: half-width t(0.975, 2) · 1/√3 = 4.302653 / 1.732051 = 2.484138
    lo, hi = t_interval([1.0, 2.0, 3.0])
    assert lo == pytest.approx(2 - 2.484138, abs=1e-5) and hi == pytest.approx(2 + 2.484138, abs=1e-5)


def test_sign_flip_p_values_by_hand():
    assert sign_flip_p([0.5]) == 1.0  # n = 1: both sign patterns are as extreme
    assert sign_flip_p([0.2, 0.3]) == 0.5  # n = 2: (+,+) and (−,−) of 4 patterns
    assert sign_flip_p([0.2, 0.3, 0.2]) == 0.25  # n = 3: the smallest p possible is 2/8
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0  # all ties
    assert sign_flip_p([1.0, -1.0, 1.0]) == 1.0  # 6 of 8 patterns reach |mean| ≥ 1/3, and the others 1
    ten = [0.1, 0.2, 0.15, 0.3, 0.05, 0.12, 0.22, 0.18, 0.09, 0.11]
    assert sign_flip_p(ten) == 2 / 1024  # n = 10, every difference positive: only the two all-same patterns
    assert math.isnan(sign_flip_p([]))


def test_paired_difference_reports_pairs_for_small_n_and_an_interval_from_five():
    d = paired_difference({"a": 3.0, "b": 5.0, "c": 9.0}, {"a": 1.0, "b": 1.0, "z": 0.0})
    assert d["n_pairs"] == 2 and d["diffs"] == [2.0, 4.0] and d["mean"] == 3.0 and d["p"] == 0.5
    assert math.isnan(d["ci_low"])  # no interval from 2 pairs
    ours = {str(i): 1.0 + 0.1 * i for i in range(10)}
    base = {str(i): 0.5 + 0.1 * i + (0.05 if i % 2 else -0.05) for i in range(10)}
    d = paired_difference(ours, base)
    assert d["n_pairs"] == 10 and d["mean"] == pytest.approx(0.5)
    # diffs are 0.45 and 0.55 alternating: s = 0.052705, half-width 2.262157 · s / √10 = 0.037703
    assert (d["ci_low"], d["ci_high"]) == (pytest.approx(0.5 - 0.037703, abs=1e-5), pytest.approx(0.5 + 0.037703, abs=1e-5))


def test_holm_by_hand():
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == {"a": 0.03, "b": pytest.approx(0.06), "c": pytest.approx(0.06)}
    out = holm({"a": 0.2, "b": float("nan")})
    assert out["a"] == 0.2 and math.isnan(out["b"])


def test_wilson_and_mcnemar_by_hand():
    # p = 13/24, z² = 3.841459: centre (p + z²/48) / (1 + z²/24) = 0.535918, half-width
    # z · sqrt(p(1 − p)/24 + z²/2304) / (1 + z²/24) = 0.185168
    lo, hi = wilson_interval(13, 24)
    assert lo == pytest.approx(0.350750, abs=1e-5) and hi == pytest.approx(0.721086, abs=1e-5)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    ours = {str(i): i < 9 for i in range(10)}  # 9 successes
    base = {str(i): i < 3 for i in range(10)}  # 3 successes: 6 discordant pairs, all for ours
    m = mcnemar_exact(ours, base)
    assert (m["ours_only"], m["base_only"]) == (6, 0) and m["p"] == pytest.approx(2 / 64)


def test_win_rate_counts_only_significant_wins_and_diverged_runs_rank_worst():
    seeds = [str(i) for i in range(8)]
    outcomes = {"t:acc": {"a": {s: 0.9 for s in seeds}, "b": {s: 0.5 for s in seeds},
                          "c": {s: 0.5 for s in seeds}}}  # a beats b and c on 8 of 8 pairs: p = 2/256 each
    wins = mean_win_rate(outcomes, {"t:acc": True})
    assert wins == {"a": 1.0, "b": 0.25, "c": 0.25}  # b and c tie with each other
    few = {"t:acc": {"a": {s: 0.9 for s in seeds[:3]}, "b": {s: 0.5 for s in seeds[:3]}}}
    assert mean_win_rate(few, {"t:acc": True}) == {"a": 0.5, "b": 0.5}  # 3 of 3 is not significant: a tie
    lower = {"t:ppl": {"a": {s: 100.0 for s in seeds}, "b": {s: float("nan") for s in seeds}}}  # b diverged
    assert mean_win_rate(lower, {"t:ppl": False}) == {"a": 1.0, "b": 0.0}


def test_pairs_needed_for_a_significant_holm_corrected_sign_test():
    from quest_bench.stats import min_pairs_for_significance

    assert min_pairs_for_significance(1) == 6  # 2/2^5 = 0.0625 > 0.05, 2/2^6 = 0.031
    assert min_pairs_for_significance(15) == 10  # 6 variants: 2/2^9 = 0.0039 > 0.05/15 = 0.0033
    assert min_pairs_for_significance(45) == 11  # 10 variants: 2/2^10 = 0.0020 > 0.05/45 = 0.0011 > 2/2^11


def test_a_sampled_sign_flip_p_value_is_never_zero():
    """Beyond EXACT_SIGN_FLIPS pairs the patterns are sampled: the estimate (hits + 1) / (draws + 1) is at least
    1 / (draws + 1), even when no sampled pattern is as extreme as the data (here 40 equal positive differences)."""
    from quest_bench.stats import RANDOM_SIGN_FLIPS, sign_flip_p

    assert sign_flip_p([1.0] * 40) == 1 / (RANDOM_SIGN_FLIPS + 1)
    assert sign_flip_p([1.0] * 16) == 2 / 2**16  # exact below the threshold
