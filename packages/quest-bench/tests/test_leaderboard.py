"""The leaderboard's stability-margin section, on synthetic results with known answers."""

import pytest

from quest_bench.leaderboard import TaskBoard, write_leaderboard
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store

RATES = (0.001, 0.01, 0.1, 1.0)


def run(variant, seed, lr, status="ok", stable=1.0, ppl=100.0):
    spec = RunSpec("lm", variant, "tiny", seed, {"lr": lr}, "x")
    metrics = {} if status != "ok" else {"test_ppl": ppl, "stable": stable}
    return spec, RunResult(run_id=spec.run_id, task="lm", task_version="1", variant=variant, preset="tiny",
                           seed=seed, overrides={"lr": lr}, status=status, metrics=metrics, primary_metric="test_ppl",
                           higher_is_better=False)


def synthetic_runs():
    out = []
    for seed in (0, 1):
        # softmax: stable up to 0.01, one seed spikes at 0.1, diverges at 1.0
        out += [run("softmax", seed, 0.001, ppl=300), run("softmax", seed, 0.01, ppl=200),
                run("softmax", seed, 0.1, stable=float(seed == 0), ppl=250), run("softmax", seed, 1.0, "diverged")]
        # quest: stable everywhere except 0.01 (so the margin stops at 0.001 even though 0.1 and 1.0 are fine)
        out += [run("quest", seed, 0.001, ppl=280), run("quest", seed, 0.01, stable=0.0, ppl=190),
                run("quest", seed, 0.1, ppl=180 + seed), run("quest", seed, 1.0, ppl=400)]
    # qnorm: seed 1 failed (a crash) at 0.1, where seed 0 reached the best value: that rate cannot be "best"
    out += [run("qnorm", s, lr, ppl=250) for s in (0, 1) for lr in (0.001, 0.01, 1.0)]
    out += [run("qnorm", 0, 0.1, ppl=150), run("qnorm", 1, 0.1, status="failed")]
    return out


def test_margin_is_the_largest_rate_stable_on_every_seed_and_below():
    board = TaskBoard("lm", "tiny", [r for _, r in synthetic_runs()])
    assert board.margin_rates() == list(RATES)
    softmax, quest = board.margin("softmax"), board.margin("quest")
    assert softmax == {"largest": 0.01, "stable": 5, "total": 8, "best": 200.0, "best_rate": 0.01}
    assert quest["largest"] == 0.001 and quest["stable"] == 6 and quest["best"] == 180.5 and quest["best_rate"] == 0.1
    assert board.margin("qnorm") == {"largest": 0.01, "stable": 7, "total": 8, "best": 250.0, "best_rate": 0.001}


def test_no_margin_section_without_a_learning_rate_sweep_or_a_stable_metric():
    runs = [r for _, r in synthetic_runs()]
    assert TaskBoard("lm", "tiny", [r for r in runs if r.overrides["lr"] < 0.1]).margin_rates() == []  # 2 rates
    for r in runs:
        r.metrics.pop("stable", None)
    assert TaskBoard("lm", "tiny", runs).margin_rates() == []


def test_leaderboard_writes_the_margin_table_and_plot(tmp_path):
    store = Store(tmp_path / "lm-stability")
    for spec, result in synthetic_runs():
        store.write(spec, result)
    folder = write_leaderboard(store, "lm-stability")
    md = (folder / "README.md").read_text()
    assert "| softmax | 0.01 | 5/8 | 200.0 | 0.01 |" in md
    assert "| quest | 0.001 | 6/8 | 180.5 | 0.1 |" in md
    assert (folder / "lm-tiny-margin.png").stat().st_size > 10_000 and "lm-tiny-margin.png" in md


def test_one_seed_gives_a_banner_no_std_no_interval_and_no_ranking(tmp_path):
    store = Store(tmp_path / "one-seed")
    for variant, value in (("softmax", 0.4), ("quest", 0.6)):
        spec = RunSpec("spurious", variant, "tiny", 0, {}, "x")
        store.write(spec, RunResult(run_id=spec.run_id, task="spurious", task_version="1", variant=variant,
                                    preset="tiny", seed=0, overrides={}, status="ok", primary_metric="robust_fraction",
                                    metrics={"robust_fraction": value}))
    md = (write_leaderboard(store, "one-seed") / "README.md").read_text()
    assert "**Too few runs for statistics.** 2 cells have fewer than 2 finished runs" in md
    assert "| softmax | 1 | 0.400 | — |" in md and "| quest | 1 | 0.600 | +0.200 (n=1: +0.200; sign-flip p=1" in md
    assert "Mean win rate" not in md


def test_a_binary_primary_gets_success_rates_with_wilson_intervals_and_mcnemar(tmp_path):
    store = Store(tmp_path / "binary")
    for seed in range(6):
        for variant, success in (("softmax", seed < 2), ("quest", seed < 5)):
            spec = RunSpec("spurious", variant, "tiny", seed, {}, "x")
            status = "diverged" if (variant, seed) == ("quest", 5) else "ok"
            store.write(spec, RunResult(
                run_id=spec.run_id, task="spurious", task_version="1", variant=variant, preset="tiny", seed=seed,
                overrides={}, status=status, primary_metric="robust_success",
                metrics={"robust_success": float(success)} if status == "ok" else {}))
    md = (write_leaderboard(store, "binary") / "README.md").read_text()
    # quest: 5 successes of 6 runs (the diverged one counts as a failure); 3 discordant pairs, all for quest
    quest = next(line for line in md.splitlines() if line.startswith("| quest |") and "/6 [" in line)
    assert "| 5/6 [0.44, 0.97] |" in quest and "+3/−0 discordant; McNemar p=0.25" in quest and "| 1 | 0 |" in quest
    assert "| 2/6 [0.10, 0.70] |" in next(line for line in md.splitlines() if line.startswith("| softmax |")
                                          and "/6 [" in line)


def test_binary_extras_and_the_per_cell_table_pair_with_softmax(tmp_path):
    """Two grid cells × 3 seeds; a second binary metric (a stricter threshold) and a continuous score. Counts and
    exact tests are checked by hand: in cell lr=0.1 quest succeeds on seeds 0-2 where softmax succeeds on seed 0
    only (2 discordant pairs: McNemar p = 0.5); its score beats softmax's by +0.5 on every seed (sign-flip p = 2/8)."""
    store = Store(tmp_path / "cells")
    for lr in (0.1, 0.01):
        for seed in range(3):
            for variant in ("softmax", "quest"):
                win = variant == "quest" or seed == 0
                strict = variant == "quest" and lr == 0.1 and seed < 2
                score = (0.8 if variant == "quest" else 0.3) if lr == 0.1 else 0.4
                spec = RunSpec("spurious", variant, "tiny", seed, {"lr": lr}, "x")
                store.write(spec, RunResult(
                    run_id=spec.run_id, task="spurious", task_version="1", variant=variant, preset="tiny", seed=seed,
                    overrides={"lr": lr}, status="ok", primary_metric="robust_success",
                    metric_directions={"robust_success": True, "robust_success_90": True, "robust_fraction": True,
                                       "biased_acc": True},
                    metrics={"robust_success": float(win), "robust_success_90": float(strict),
                             "robust_fraction": score, "biased_acc": 0.99}))
    md = (write_leaderboard(store, "cells") / "README.md").read_text()
    lines = md.splitlines()
    pooled = next(line for line in lines if line.startswith("| quest | 6 |"))
    assert "| 2/6 (+2/−0, p=0.5) |" in pooled  # robust_success_90 over both cells, paired with softmax's 0/6
    assert "mean `robust_fraction`" in md  # the continuous score closest in name to the primary
    cells = [line for line in lines if line.startswith("| lr=")]
    assert [c.split(" | ")[0] for c in cells] == ["| lr=0.01"] * 2 + ["| lr=0.1"] * 2  # numeric order
    quest_01 = next(c for c in cells if c.startswith("| lr=0.1 | quest"))
    assert quest_01 == "| lr=0.1 | quest | 3/3 (+2/−0, p=0.5) | 2/3 (+2/−0, p=0.5) | 0.80 (+0.50, p=0.25) |"


def tuned_run(variant, seed, lr, val, test, status="ok"):
    spec = RunSpec("lm", variant, "tiny", seed, {"lr": lr}, "x")
    return spec, RunResult(run_id=spec.run_id, task="lm", task_version="1", variant=variant, preset="tiny", seed=seed,
                           overrides={"lr": lr}, status=status, primary_metric="test_ppl", higher_is_better=False,
                           validation_metric="valid_ppl", preset_values={"lr": 0.003},
                           metrics={"test_ppl": test, "valid_ppl": val} if status == "ok" else {})


def test_a_tuned_suite_picks_each_variant_on_validation_and_reports_test(tmp_path):
    """lm's tiny default lr is 0.003. softmax is best (on validation) at 0.003; quest's best validation is at 0.03,
    where one seed diverged, so that cell cannot be chosen and 0.01 is; the test metric of a cell never decides."""
    from quest_bench import tuning

    store = Store(tmp_path / "lm-tuned")
    for seed in range(3):
        for spec, r in (tuned_run("softmax", seed, 0.003, 200, 210 + seed), tuned_run("softmax", seed, 0.01, 220, 150),
                        tuned_run("quest", seed, 0.003, 205, 212 + seed), tuned_run("quest", seed, 0.01, 190, 195 + seed),
                        tuned_run("quest", seed, 0.03, 100, 100, "diverged" if seed == 2 else "ok")):
            store.write(spec, r)
    board = TaskBoard("lm", "tiny", [r for r in Store(tmp_path / "lm-tuned").load()])
    options = tuning.choices(board.by_variant["quest"], ("lr",), "valid_ppl")
    assert tuning.best(options, higher_is_better=False).cell == {"lr": 0.01}
    assert tuning.preset_cell(board.runs, ("lr",)) == {"lr": 0.003}  # the default recipe, as the runs stored it
    md = (write_leaderboard(store, "lm-tuned", tune=("lr",)) / "README.md").read_text()
    quest = next(line for line in md.splitlines() if line.startswith("| quest | 213.000 ± 1.000 (3)"))
    cells = [c.strip() for c in quest.strip("|").split("|")]
    assert cells[3:6] == ["lr=0.01", "190.000", "196.000 ± 1.000 (3)"]
    assert cells[6].startswith(  # n=3 < 5: the per-pair values and an exact p, no interval
        "-15.000 (n=3: -15.000, -15.000, -15.000; sign-flip p=0.25")
    assert cells[7] == "1 / 0 of 9"
    softmax = next(line for line in md.splitlines() if line.startswith("| softmax | 211.000"))
    assert "| lr=0.003 (edge of lr) | 200.000 |" in softmax  # the smallest rate searched: flagged
    assert "the optimum may lie outside the search" in md
    # the summary at the top compares each variant at its best cell, not pooled over the search
    assert "| lm (tiny) | test_ppl ↓ | -15.000 (p 0.25, n=3) |" in md
    assert "the win rate is over the whole search" in md  # and says that it pools the grid cells


def test_performance_profile_ratios_by_hand():
    from quest_bench import profiles

    scores = {"acc": {"softmax": 0.8, "quest": 0.88}, "ppl": {"softmax": 100.0, "quest": 110.0},
              "gone": {"softmax": 0.5, "quest": float("nan")}, "delta": {"softmax": -0.1, "quest": 0.2}}
    ratios, skipped = profiles.ratios(scores, {"acc": True, "ppl": False, "gone": True, "delta": True})
    assert skipped == ["delta"]  # not all positive: left out
    assert ratios["acc"] == pytest.approx({"softmax": 1.1, "quest": 1.0})
    assert ratios["ppl"] == pytest.approx({"softmax": 1.0, "quest": 1.1})
    assert ratios["gone"]["quest"] == float("inf")
    rho = profiles.profile(ratios, taus=(1.0, 1.1, 2.0))
    assert rho["quest"] == pytest.approx([1 / 3, 2 / 3, 2 / 3])  # best on ppl; 1.1x on acc; never on "gone"
    assert rho["softmax"] == pytest.approx([2 / 3, 1.0, 1.0])


def test_a_cell_with_missing_seeds_cannot_be_chosen():
    """A search still running: quest's lr=0.03 cell has the best validation value but one of its three seeds."""
    from quest_bench import tuning

    runs = [tuned_run("quest", s, 0.01, 190, 195)[1] for s in range(3)] + [tuned_run("quest", 0, 0.03, 100, 100)[1]]
    options = tuning.choices(runs, ("lr",), "valid_ppl")
    assert tuning.best(options, higher_is_better=False).cell == {"lr": 0.01}


def test_a_best_cell_at_the_edge_of_a_numeric_search_is_flagged():
    from quest_bench import tuning

    options = [tuning.Choice({"lr": lr, "opt": "adamw"}) for lr in (0.001, 0.003, 0.01)]
    assert tuning.edge_keys(options, options[0]) == ["lr"] and tuning.edge_keys(options, options[2]) == ["lr"]
    assert tuning.edge_keys(options, options[1]) == []  # inside the search; "opt" is not numeric
    assert tuning.edge_keys(options[:1], options[0]) == []  # one value: nothing was searched


def test_the_performance_profile_covers_tuned_and_untuned_boards(tmp_path):
    """Two tasks on one page: lm (tuned, each variant at its best lr) and a task without a validation metric (its
    mean over every run); quest is best on lm (ppl 190 vs 200) and 0.9/0.8 = 1.125x behind on the other."""
    store = Store(tmp_path / "two")
    for seed in range(2):
        for spec, r in (tuned_run("softmax", seed, 0.003, 200, 200), tuned_run("softmax", seed, 0.01, 210, 205),
                        tuned_run("quest", seed, 0.003, 205, 205), tuned_run("quest", seed, 0.01, 190, 190)):
            store.write(spec, r)
        for variant, acc in (("softmax", 0.9), ("quest", 0.8)):
            spec = RunSpec("image-cls", variant, "tiny", seed, {"lr": 0.003}, "x")
            store.write(spec, RunResult(run_id=spec.run_id, task="image-cls", task_version="1", variant=variant,
                                        preset="tiny", seed=seed, overrides={"lr": 0.003}, status="ok",
                                        primary_metric="test_acc", metrics={"test_acc": acc}))
    folder = write_leaderboard(store, "two", tune=("lr",))
    md = (folder / "README.md").read_text()
    assert "| quest | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 1.00 | 1.00 | 1.00 |" in md
    assert "| softmax | 0.50 | 0.50 | 0.50 | 0.50 | 1.00 |" in md  # 200/190 = 1.053: within τ = 1.1, not 1.05
    assert (folder / "performance-profile.png").stat().st_size > 1000
