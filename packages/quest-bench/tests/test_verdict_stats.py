"""The decision rule, the minimum detectable effect and the cross-domain meta-analysis, on cases worked by hand
(scipy's t and normal distributions serve as the tables; the functions under test are not used to compute the
expected values)."""

import math

import numpy as np
import pytest
from scipy import stats as st

from quest_bench.meta import (dersimonian_laird, forest_plot, largest_stable_lr, stability_against_baseline,
                              standardised_effect)
from quest_bench.result import RunResult
from quest_bench.stats import (RANDOM_SIGN_FLIPS, decide, format_p, mde_paired_t, paired_difference,
                               power_paired_t)

T975_9 = 2.262157  # t(0.975, 9), from a t table


def alternating(mean: float, half: float, n: int = 10) -> list[float]:
    """n differences mean − half, mean + half, ...: mean ``mean``, s = half·√(n/(n − 1)), se = half/√(n − 1)."""
    return [mean + (half if i % 2 else -half) for i in range(n)]


def test_a_significant_case_at_n_10_by_hand():
    # diffs 0.0, 0.2, ... (n = 10): mean 0.1, s = 0.1·√(10/9) = 0.105409, se = s/√10 = 0.1/3, t = 3.0
    out = decide({"b": alternating(0.1, 0.1)})["b"]
    p = 2 * st.t.sf(3.0, 9)  # 0.014956
    assert out["n"] == 10 and out["mean"] == pytest.approx(0.1) and out["sd"] == pytest.approx(0.105409, abs=1e-6)
    assert out["p"] == pytest.approx(p, rel=1e-6) and out["p_holm"] == pytest.approx(p, rel=1e-6)  # a family of one
    assert out["level"] == pytest.approx(0.95)
    assert out["ci_low"] == pytest.approx(0.1 - T975_9 * 0.1 / 3, abs=1e-6)
    assert out["ci_high"] == pytest.approx(0.1 + T975_9 * 0.1 / 3, abs=1e-6)
    assert out["verdict"] == "better" and out["mark"] == "*" and out["words"].startswith("better: Δ +0.1 [+0.0246")
    # sign flips: five 0.0s and five 0.2s; |mean| ≥ 0.1 only when the five 0.2s share a sign: 2·32 of 1024 patterns
    assert out["p_sign_flip"] == pytest.approx(2 / 32)
    assert out["sign_flip_floor"] is None  # exact at n = 10


def test_holm_across_the_page_decides_and_the_interval_follows_it_by_hand():
    # b: t = 3.0 as above. d: mean 0.1, half 0.12 → se = 0.04, t = 2.5. c: mean 0.1, half 0.2 → se = 0.2/3, t = 1.5.
    diffs = {"b": alternating(0.1, 0.1), "d": alternating(0.1, 0.12), "c": alternating(0.1, 0.2)}
    out = decide(diffs)
    p_b, p_d, p_c = (2 * st.t.sf(t, 9) for t in (3.0, 2.5, 1.5))  # 0.01496, 0.03386, 0.16791
    # Holm: b·3 = 0.0449, d: max(0.0449, 2·0.03386) = 0.0677, c: max(0.0677, 0.1679) = 0.1679
    assert out["b"]["p_holm"] == pytest.approx(3 * p_b, rel=1e-6)
    assert out["d"]["p_holm"] == pytest.approx(2 * p_d, rel=1e-6)
    assert out["c"]["p_holm"] == pytest.approx(p_c, rel=1e-6)
    # d alone would be significant (p = 0.034, its 95% interval 0.1 ± 2.262·0.04 = [0.0095, 0.19] excludes 0); after
    # Holm it is not, and its interval is at 1 − 0.05·p/p_Holm = 97.5%: 0.1 ± t(0.9875, 9)·0.04, which includes 0
    t9875 = st.t.ppf(0.9875, 9)  # 2.685
    assert out["d"]["level"] == pytest.approx(0.975)
    assert out["d"]["ci_low"] == pytest.approx(0.1 - t9875 * 0.04, abs=1e-6) and out["d"]["ci_low"] < 0
    assert (out["d"]["verdict"], out["d"]["mark"]) == ("within", "")
    assert "within [" in out["d"]["words"] and "no difference" not in out["d"]["words"]
    # b is significant at level 1 − 0.05/3: 0.1 ± t(1 − 0.05/6, 9)·0.1/3 excludes 0
    t_b = st.t.ppf(1 - 0.05 / 6, 9)
    assert out["b"]["level"] == pytest.approx(1 - 0.05 / 3)
    assert out["b"]["ci_low"] == pytest.approx(0.1 - t_b * 0.1 / 3, abs=1e-6) and out["b"]["ci_low"] > 0
    assert (out["b"]["verdict"], out["b"]["mark"]) == ("better", "*")
    assert out["c"]["level"] == pytest.approx(0.95) and out["c"]["verdict"] == "within"


def test_direction_equivalence_and_too_few_pairs():
    diffs = {"lower": alternating(0.5, 0.05), "eq": alternating(0.01, 0.02), "few": [1.0, 2.0, 3.0]}
    out = decide(diffs, higher_is_better={"lower": False}, margins={"eq": 0.05, "lower": 10.0})
    assert out["lower"]["verdict"] == "worse" and out["lower"]["mark"] == "*"  # larger is worse: significance wins
    # eq: mean 0.01, se 0.02/3: the interval (≈ 0.01 ± 0.019) lies inside ±0.05
    assert out["eq"]["verdict"] == "equivalent" and out["eq"]["words"].startswith("equivalent within ±0.05")
    assert out["few"]["verdict"] == "no verdict" and out["few"]["mark"] == "" and math.isnan(out["few"]["p_holm"])
    # the n = 3 comparison stays out of the Holm family: a family of two, "lower" (t = 30) first, so p_Holm = 2p
    assert out["lower"]["p"] == pytest.approx(2 * st.t.sf(30.0, 9), rel=1e-6)
    assert out["lower"]["p_holm"] == pytest.approx(2 * out["lower"]["p"], rel=1e-9)
    assert out["eq"]["p_holm"] == pytest.approx(2 * st.t.sf(1.5, 9), rel=1e-6)


@pytest.mark.parametrize("seed", range(30))
def test_mark_interval_and_words_never_disagree(seed):
    rng = np.random.default_rng(seed)
    diffs = {i: list(rng.normal(rng.normal(0, 0.5), 1.0, size=int(rng.integers(10, 16)))) for i in range(6)}
    for out in decide(diffs).values():
        excludes_zero = out["ci_low"] > 0 or out["ci_high"] < 0
        assert excludes_zero == (out["mark"] == "*") == (out["verdict"] in ("better", "worse"))
        assert (out["p_holm"] < 0.05) == excludes_zero
        assert out["words"].startswith(out["verdict"] if out["verdict"] != "within" else "not significant")


def test_mde_against_an_independent_simulation_and_the_normal_approximation():
    n, sd = 10, 2.0
    mde = mde_paired_t(n, sd)
    rng = np.random.default_rng(7)
    draws = rng.normal(mde, sd, size=(40_000, n))
    t = draws.mean(axis=1) / (draws.std(axis=1, ddof=1) / math.sqrt(n))
    power = np.mean(2 * st.t.sf(np.abs(t), n - 1) < 0.05)
    assert power == pytest.approx(0.80, abs=3 * math.sqrt(0.8 * 0.2 / 40_000))
    # large n: the normal approximation (z(0.975) + z(0.8)) / √n = (1.959964 + 0.841621) / √400 = 0.140079 sd
    assert mde_paired_t(400) == pytest.approx(0.140079, rel=3e-3)
    assert power_paired_t(0.0, 10) == pytest.approx(0.05)  # no effect: rejections at the test's level
    assert math.isnan(mde_paired_t(1, 1.0))


def test_p_values_at_the_monte_carlo_floor_print_as_an_upper_bound():
    d = paired_difference({str(i): 1.0 + 0.01 * i for i in range(30)}, {str(i): 0.0 for i in range(30)})
    floor = 1 / (RANDOM_SIGN_FLIPS + 1)
    # n = 30: sampled, and the 2 extreme patterns of 2^30 are never drawn: the estimate sits at its floor
    assert d["p"] == pytest.approx(floor) and d["p_floor"] == pytest.approx(floor)
    assert format_p(d["p"], d["p_floor"]) == "p ≤ 5e-06"
    from quest_bench.leaderboard import delta_text

    assert "sign-flip p ≤ 5e-06" in delta_text(d, False)  # the leaderboard's Δ cells too
    assert format_p(0.0123, floor) == "p = 0.012" and format_p(float("nan")) == "p = —"
    exact = paired_difference({str(i): 1.0 for i in range(10)}, {str(i): 0.0 for i in range(10)})
    assert exact["p_floor"] is None and format_p(exact["p"], exact["p_floor"]) == "p = 0.002"


# ---- across domains (quest_bench.meta) --------------------------------------------------------------------------

def test_standardised_paired_effect_by_hand():
    # diffs 0.3, 0.1, 0.4, 0.2, 0.5: mean 0.3, s = √0.025 = 0.158114, d_z = 1.897367 (d_z² = 3.6);
    # J = 1 − 3/(4·4 − 1) = 0.8, g = 1.517893, se = 0.8·√(1/5 + 3.6/10) = 0.8·√0.56 = 0.598665
    e = standardised_effect([0.3, 0.1, 0.4, 0.2, 0.5])
    assert e["d_z"] == pytest.approx(1.897367, abs=1e-6) and e["g"] == pytest.approx(1.517893, abs=1e-6)
    assert e["se"] == pytest.approx(0.598665, abs=1e-6)
    assert e["ci_low"] == pytest.approx(1.517893 - 1.959964 * 0.598665, abs=1e-5)
    lower = standardised_effect([0.3, 0.1, 0.4, 0.2, 0.5], higher_is_better=False)  # a larger error is worse
    assert lower["g"] == pytest.approx(-1.517893, abs=1e-6) and lower["se"] == pytest.approx(0.598665, abs=1e-6)
    assert math.isnan(standardised_effect([0.1, 0.2])["g"]) and math.isnan(standardised_effect([0.1] * 5)["g"])


def test_dersimonian_laird_on_three_studies_by_hand():
    # y = 0.2, 0.5, 0.9; se = 0.1, 0.2, 0.25 → w = 100, 25, 16, Σw = 141, Σw² = 10881
    # fixed = (20 + 12.5 + 14.4)/141 = 0.332624; Q = 100·0.132624² + 25·0.167376² + 16·0.567376² = 7.609929
    # C = 141 − 10881/141 = 63.829787; τ² = (7.609929 − 2)/63.829787 = 0.087889; I² = 5.609929/7.609929 = 0.737185
    # w* = 1/(v + τ²) = 10.215664, 7.819288, 6.649427; pooled = Σw*y/Σw* = 0.483596; se = 1/√Σw* = 0.201275
    out = dersimonian_laird([0.2, 0.5, 0.9], [0.1, 0.2, 0.25])
    assert out["k"] == 3 and out["q"] == pytest.approx(7.609929, abs=1e-6)
    assert out["tau2"] == pytest.approx(0.087889, abs=1e-6) and out["i2"] == pytest.approx(0.737185, abs=1e-6)
    assert out["pooled"] == pytest.approx(0.483596, abs=1e-6) and out["se"] == pytest.approx(0.201275, abs=1e-6)
    assert (out["ci_low"], out["ci_high"]) == (pytest.approx(0.089105, abs=1e-5), pytest.approx(0.878087, abs=1e-5))
    assert out["p"] == pytest.approx(2 * st.norm.sf(0.483596 / 0.201275), rel=1e-4)
    assert sum(out["weights"]) == pytest.approx(1.0)
    # homogeneous studies: Q < k − 1, so τ² = 0, I² = 0 and the pooled estimate is the fixed-effect mean
    same = dersimonian_laird([0.30, 0.31, 0.29], [0.1, 0.1, 0.1])
    assert same["tau2"] == 0.0 and same["i2"] == 0.0 and same["pooled"] == pytest.approx(0.30)
    assert math.isnan(dersimonian_laird([0.3], [0.1])["pooled"])  # one study: nothing to pool


def test_forest_plot_writes_a_png(tmp_path):
    studies = [{"label": f"task {i} $x$", **standardised_effect([0.1 * i + 0.05 * j for j in range(5)])}
               for i in range(1, 4)]
    pooled = dersimonian_laird([s["g"] for s in studies], [s["se"] for s in studies])
    forest_plot({"quest": (studies, pooled), "qknorm": (studies[:2], pooled)}, tmp_path / "forest.png", "test")
    assert (tmp_path / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_largest_stable_learning_rate_per_task_and_variant():
    def run(variant, lr, status):
        return RunResult(run_id=f"{variant}{lr}{status}", task="t", task_version="1", variant=variant, preset="tiny",
                         seed=0, overrides={"lr": lr}, status=status)

    runs = [run("softmax", 0.001, "ok"), run("softmax", 0.01, "ok"), run("softmax", 0.01, "diverged"),
            run("quest", 0.001, "ok"), run("quest", 0.01, "ok"), run("qknorm", 0.001, "diverged"),
            run("qknorm", 0.01, "failed")]
    table = largest_stable_lr([("t (tiny)", r) for r in runs])
    assert table[("t (tiny)", "softmax")] == {"largest": 0.001, "searched": 0.01, "diverged": 1, "runs": 3}
    assert table[("t (tiny)", "quest")]["largest"] == 0.01  # the largest searched: the limit lies beyond
    assert table[("t (tiny)", "qknorm")]["largest"] is None  # diverged at 1e-3, nothing finished at 1e-2
    table[("u (tiny)", "softmax")] = table[("u (tiny)", "quest")] = {"largest": 0.01, "searched": 0.01}
    counts = stability_against_baseline(table)
    assert counts["quest"] == {"higher": 1, "same": 0, "lower": 0, "beyond": 1, "tasks": 1}  # u: both beyond
    assert counts["qknorm"] == {"higher": 0, "same": 0, "lower": 1, "beyond": 0, "tasks": 1}  # none < 1e-3
