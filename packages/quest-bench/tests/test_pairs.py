"""quest-bench pairs: two variants tested against each other per level of a grid key and pooled (hand-computed)."""

from __future__ import annotations

import math

import pytest

from quest_bench.cli import main
from quest_bench.pairs import pair_tests
from quest_bench.result import RunResult


def run(variant, seed, wd, value, lr=0.01, status="ok", metric="robust_success"):
    metrics = {} if status != "ok" else {metric: value}
    return RunResult(run_id=f"{variant}-{seed}-{wd}-{lr}", task="toy", task_version="1", variant=variant, preset="tiny",
                     seed=seed, overrides={"lr": lr, "weight_decay": wd}, status=status, metrics=metrics,
                     primary_metric=metric)


def test_binary_metric_gets_mcnemar_per_level_with_holm_and_a_diverged_run_is_a_failure():
    runs = []
    # wd 0: quest succeeds on seeds 0-5, qknorm on none -> 6 discordant pairs all for quest: p = 2 / 2**6 = 0.03125
    for s in range(6):
        runs += [run("quest", s, 0.0, 1.0), run("qknorm", s, 0.0, 0.0)]
    # wd 1: both succeed on seeds 0-3; on seed 4 qknorm diverged (a failure) and quest succeeded; seed 5 both fail
    for s in range(4):
        runs += [run("quest", s, 1.0, 1.0), run("qknorm", s, 1.0, 1.0)]
    runs += [run("quest", 4, 1.0, 1.0), run("qknorm", 4, 1.0, math.nan, status="diverged")]
    runs += [run("quest", 5, 1.0, 0.0), run("qknorm", 5, 1.0, 0.0), run("softmax", 5, 1.0, 1.0)]
    level0, level1, pooled = pair_tests(runs, "quest", "qknorm", "robust_success", by="weight_decay")
    assert (level0.level, level0.n_pairs, level0.a_value, level0.b_value) == ("0.0", 6, 6, 0)
    assert level0.test == "McNemar" and level0.p == pytest.approx(0.03125)
    assert (level1.n_pairs, level1.a_value, level1.b_value, level1.a_only, level1.b_only) == (6, 5, 4, 1, 0)
    assert level1.p == pytest.approx(1.0)  # 1 discordant pair: binomial(1; 1, 1/2) two-sided = 1
    assert level0.p_holm == pytest.approx(0.0625) and level1.p_holm == pytest.approx(1.0)  # Holm over the 2 levels
    assert (pooled.level, pooled.n_pairs, pooled.a_only, pooled.b_only) == ("pooled", 12, 7, 0)
    assert pooled.p == pytest.approx(2 / 2**7)
    assert math.isnan(pooled.p_holm)  # the pooled test is not part of the correction


def test_continuous_metric_gets_the_paired_t_test_and_leaves_out_pairs_without_a_value():
    diffs = [0.1, 0.2, 0.3, 0.4, 0.5]
    runs = []
    for s, d in enumerate(diffs):
        runs += [run("quest", s, 0.1, 0.5 + d, metric="score"), run("qknorm", s, 0.1, 0.5, metric="score")]
    runs += [run("quest", 9, 0.1, 0.0, status="failed", metric="score"), run("qknorm", 9, 0.1, 0.5, metric="score")]
    (pooled,) = pair_tests(runs, "quest", "qknorm", "score")
    assert (pooled.n_pairs, pooled.left_out, pooled.test) == (5, 1, "paired t")
    # mean 0.3, sd = sqrt(0.025) = 0.1581, se = 0.0707, t = 4.243 on 4 df: two-sided p = 0.01324; half-width
    # t_{0.975, 4} * se = 2.7764 * 0.07071 = 0.19632
    assert pooled.mean_diff == pytest.approx(0.3)
    assert pooled.p == pytest.approx(0.013236, rel=1e-3)
    assert (pooled.ci_low, pooled.ci_high) == pytest.approx((0.3 - 0.19632, 0.3 + 0.19632), abs=1e-4)
    assert pooled.sign_flip_p == pytest.approx(2 / 2**5)  # every difference positive: 2 of 32 sign patterns


def test_below_five_pairs_no_t_test_is_made():
    runs = [r for s, d in enumerate([0.1, -0.2]) for r in (run("quest", s, 0.1, 0.5 + d, metric="score"),
                                                            run("qknorm", s, 0.1, 0.5, metric="score"))]
    (pooled,) = pair_tests(runs, "quest", "qknorm", "score")
    assert pooled.diffs == pytest.approx((0.1, -0.2)) and math.isnan(pooled.p) and math.isnan(pooled.ci_low)
    assert pooled.sign_flip_p == pytest.approx(1.0)


def test_bad_requests_are_clear_errors(capsys):
    runs = [run("quest", 0, 0.1, 1.0), run("qknorm", 0, 0.1, 1.0)]
    with pytest.raises(ValueError, match=r"no runs of variant 'qnorm'; the runs hold \['qknorm', 'quest'\]"):
        pair_tests(runs, "quest", "qnorm", "robust_success")
    with pytest.raises(ValueError, match="does not set 'depth'"):
        pair_tests(runs, "quest", "qknorm", "robust_success", by="depth")
    with pytest.raises(ValueError, match="no finished run has metric 'nope'"):
        pair_tests(runs, "quest", "qknorm", "nope")
    assert main(["pairs", "--suite", "x", "--variants", "quest"]) == 2
    assert "--variants takes two different variants as A,B" in capsys.readouterr().err


def test_the_command_reads_a_published_suite(capsys):
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "docs" / "results" / "spurious-mini"
    assert main(["pairs", "--from", str(folder), "--variants", "quest,softmax", "--metric", "robust_fraction"]) == 0
    out = capsys.readouterr().out
    assert "**spurious (tiny)**" in out and "| pooled | 2 | 0 |" in out
