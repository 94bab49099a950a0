"""The leaderboard's outputs a researcher reuses: tables as numbers, 0/1 metrics drawn with their Wilson interval,
a tuned suite's figures at each variant's chosen cell, ad-hoc runs grouped by config."""

import json
import math

from quest_bench.leaderboard import at_chosen_cells, figure_points, group, write_leaderboard
from quest_bench.result import RunResult
from quest_bench.runs import RunSet
from quest_bench.stats import wilson_interval


def result(variant, seed, value, lr=0.001, metric="acc", val=None, status="ok"):
    metrics = {metric: value, **({"val_acc": val} if val is not None else {})}
    return RunResult(run_id=f"{variant}-{seed}-{lr}-{metric}", task="t", task_version="1", variant=variant,
                     preset="tiny", seed=seed, overrides={"lr": lr}, status=status, primary_metric=metric,
                     metrics=metrics, validation_metric="val_acc" if val is not None else "")


def runset(results, suite="s"):
    runs = RunSet()
    for r in results:
        runs.add(r, f"/nonexistent/{r.run_id}", suite, canonical=r.run_id)
    return runs


def test_tables_beside_the_leaderboard_hold_numbers(tmp_path):
    results = [result(v, s, 0.8 + 0.01 * s + (0.02 if v == "quest" else 0)) for v in ("softmax", "quest")
               for s in range(6)]
    folder = write_leaderboard(runset(results), "s", folder=tmp_path / "board")
    rows = json.loads((folder / "tables" / "results.json").read_text())
    quest = next(r for r in rows if r["variant"] == "quest")
    assert quest["n"] == 6 and isinstance(quest["mean"], float) and quest["ci_low"] < quest["mean"] < quest["ci_high"]
    assert math.isclose(quest["delta"], 0.02) and isinstance(quest["p"], float) and quest["delta_ci_low"] is not None
    assert next(r for r in rows if r["variant"] == "softmax")["p"] is None  # the baseline has no comparison
    page_tables = [json.loads(p.read_text()) for p in (folder / "tables").glob("0*.json")]
    cells = [v for table in page_tables for row in table for k, v in row.items() if k == "n"]
    assert cells and all(isinstance(v, int) for v in cells)  # "n": 6, not "6"
    assert "results.csv" in (folder / "README.md").read_text()


def test_a_binary_metric_is_drawn_with_its_wilson_interval():
    board = group([result(v, s, float(s % 2), metric="success") for v in ("softmax", "quest") for s in range(4)])[0]
    assert board.binary
    for variant, point, low, high in figure_points(board):
        assert point == 0.5 and (low, high) == wilson_interval(2, 4) and 0 <= low < high <= 1


def test_a_tuned_suite_s_figures_show_each_variant_at_its_chosen_cell():
    results = [result(v, s, acc + 0.001 * s, lr=lr, val=acc) for v, best in (("softmax", 0.001), ("quest", 0.01))
               for lr in (0.001, 0.01) for s in range(3) for acc in [0.9 if lr == best else 0.5]]
    board = group(results)[0]
    shown = at_chosen_cells(board, ("lr",))
    assert {(r.variant, r.overrides["lr"]) for r in shown.runs} == {("softmax", 0.001), ("quest", 0.01)}
    assert len(shown.runs) == 6 and all(p[1] > 0.89 for p in figure_points(shown))
    assert at_chosen_cells(board, ()) is board


def test_ad_hoc_runs_are_grouped_by_config_never_averaged_across_configs(tmp_path):
    results = [result("quest", 0, 0.9, lr=0.001), result("quest", 0, 0.5, lr=0.01)]
    assert len(group(results)) == 1  # a suite's board pools its grid (the per-cell tables split it)
    boards = group(results, by_config=True)
    assert [b.title for b in boards] == ["t (tiny) [lr=0.001]", "t (tiny) [lr=0.01]"]
    folder = write_leaderboard(runset(results, "adhoc"), "adhoc", folder=tmp_path / "board")
    rows = json.loads((folder / "tables" / "results.json").read_text())
    assert sorted((r["config"], r["mean"]) for r in rows) == [("lr=0.001", 0.9), ("lr=0.01", 0.5)]
