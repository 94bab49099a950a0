"""The report is data, then rendering: tables render to Markdown, HTML, CSV and JSON from the same cells; the task's
conventions (curves, log axes, stability axis and metric, robustness metric, directions) come from the records (or,
for records without them, the task's declaration), disagreements are shown, and the report code names no task."""

import csv
import io
import json
import math
import re
import tokenize
from pathlib import Path

import pytest

from quest_bench.conventions import of_runs
from quest_bench.leaderboard import curve_means, group, write_leaderboard
from quest_bench.publish import result_of, run_rows
from quest_bench.registry import get_task, task_names
from quest_bench.report_tables import Num, Page, Table, Text, write_data
from quest_bench.result import RunResult
from quest_bench.runs import RunSet
from quest_bench.spec import slug
from quest_sdk.task import Task

SRC = Path(__file__).resolve().parents[1] / "src" / "quest_bench"
REPORT_CODE = ("leaderboard.py", "report_tables.py", "conventions.py", "meta.py", "publish.py", "profiles.py")
CONV = {"curves": ["loss", "probe_norm"], "log_curves": ["probe_norm"], "stability_axis": "warmup",
        "stability_metric": "calm", "stability_note": "no probe overflow", "robustness_metric": "corrupted_score"}


def task_specific_names() -> set[str]:
    """Every registered task's name and the metric and curve names it declares beyond the SDK's defaults."""
    names = set()
    for name in task_names():
        task = get_task(name)
        names |= {name, task.primary_metric, *task.leaderboard_metrics, *(task.validation_metric or "").split()}
        names |= set(task.curve_keys) - set(Task.curve_keys)
        names |= {task.stability_note} - {""}
    return names


def test_the_report_code_names_no_task_and_no_task_specific_metric():
    assert "spurious" in task_names() and "biased_answer_key_norm" in task_specific_names()
    found = []
    for file in REPORT_CODE:
        with open(SRC / file, "rb") as f:  # every string literal (f-strings and docstrings too), not identifiers
            strings = [t.string for t in tokenize.tokenize(f.readline) if t.type == tokenize.STRING]
        for name in task_specific_names():
            pattern = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
            found += [f"{file}: {name} in {text[:60]!r}" for text in strings if pattern.search(text)]
    assert found == []
    # the check sees a special case such as the one this test replaced
    assert any(re.search(r"(?<![\w-])lm(?![\w-])", t.string) for t in tokenize.tokenize(
        io.BytesIO(b'x = f"and, for `lm`, better than the unigram baseline"').readline) if t.type == tokenize.STRING)


def result(variant, seed, value, conventions=CONV, lr=0.1, task="probe", directions=None, **kw):
    return RunResult(run_id=f"{task}-{variant}-{seed}-{lr}-{conventions.get('stability_axis', 'none')}", task=task,
                     task_version="1", variant=variant, preset="tiny", seed=seed, overrides={"warmup": lr},
                     status="ok", primary_metric="score", metrics={"score": value, "calm": 1.0, **kw},
                     metric_directions=directions or {"score": True, "corrupted_score": True},
                     conventions=conventions)


def runset(results, folders: Path | None = None):
    runs = RunSet()
    for r in results:
        runs.add(r, (folders / r.run_id) if folders else f"/nonexistent/{r.run_id}", "s", canonical=r.run_id)
    return runs


def test_a_table_renders_the_same_cells_to_markdown_html_csv_and_json(tmp_path):
    hostile = "x|y [a](javascript:alert(1)) <b>"
    table = Table([Text("variant"), Text("{} mean", hostile), Text("rate")],
                  [[hostile, Num(0.53333, "0.533"), 7], ["quest", Num(float("nan"), "—"), None]])
    page = Page(["## Sec `one`", "", table])
    md = page.markdown().splitlines()
    assert md[2] == r"| variant | x\|y \[a\](javascript:alert(1)) \<b\> mean | rate |"
    assert md[4] == r"| x\|y \[a\](javascript:alert(1)) \<b\> | 0.533 | 7 |" and md[5] == "| quest | — | — |"
    assert "<b>" not in table.html() and "&lt;b&gt;" in table.html() and table.html().count("<tr>") == 3
    names = write_data(page.tables, tmp_path, slug)
    assert names == ["01-Sec_one.csv", "01-Sec_one.json"]
    rows = list(csv.reader(open(tmp_path / "01-Sec_one.csv", newline="")))
    assert rows == [["variant", f"{hostile} mean", "rate"], [hostile, "0.53333", "7"], ["quest", "", ""]]
    assert json.loads((tmp_path / "01-Sec_one.json").read_text()) == [
        {"variant": hostile, f"{hostile} mean": 0.53333, "rate": 7}, {"variant": "quest", f"{hostile} mean": None,
                                                                      "rate": None}]
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        Table(["a", "b", "c"], [[1, 2]])


def test_conventions_round_trip_through_the_record_and_the_published_row():
    r = result("quest", 0, 0.5)
    assert RunResult.from_dict(json.loads(r.to_json())).conventions == CONV
    assert result_of(run_rows(runset([r]), {})[0]).conventions == CONV
    for bad in (["loss"], {"curves": "loss"}, {"stability_axis": 3}):
        with pytest.raises(ValueError, match="field 'conventions'"):
            RunResult.from_dict({**json.loads(r.to_json()), "conventions": bad})
    spurious = get_task("spurious").conventions()
    assert "biased_answer_key_norm" in spurious["curves"] and "biased_answer_key_norm" in spurious["log_curves"]
    assert Task.conventions()["robustness_metric"] == ""  # the SDK declares none


def test_curves_stability_and_robustness_follow_the_stored_conventions(tmp_path):
    results = [result(v, s, 0.5 + 0.1 * s + (v == "quest") * 0.05, lr=lr, corrupted_score=0.3 + 0.01 * s)
               for v in ("softmax", "quest") for s in range(2) for lr in (0.01, 0.1, 1.0)]
    for r in results:
        folder = tmp_path / "runs" / r.run_id
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0 / (i + 1), "probe_norm": 2.0,
                                                                 "max_logit": 9.0}) + "\n" for i in range(3)))
    runs = runset(results, tmp_path / "runs")
    board = group(results)[0]
    assert list(curve_means(board, runs.folders)) == ["loss", "probe_norm"]  # max_logit is not declared
    assert board.margin_rates() == [0.01, 0.1, 1.0] and board.robustness_metric() == "corrupted_score"
    md = (write_leaderboard(runs, "s", folder=tmp_path / "lb") / "README.md").read_text()
    assert "Stability margin over `warmup` = 0.01, 0.1, 1: " in md and "(`calm` = 1: no divergence, no probe " \
        "overflow)" in md
    assert "| variant | largest stable warmup | stable runs | best score | at warmup |" in md
    assert "records hold none" not in md and "Runs disagree" not in md


def test_runs_that_disagree_are_shown_never_decided_by_the_first_run(tmp_path):
    other = {**CONV, "curves": ["loss"], "log_curves": [], "stability_axis": "lr"}
    results = [result(v, s, 0.5, conventions=CONV if s == 0 else other) for v in ("softmax", "quest") for s in
               range(2)]
    conv = of_runs("probe (tiny)", results)
    assert conv.curves == ["loss", "probe_norm"] and conv.log_curves == []  # every run's curves; no shared log axis
    assert conv.stability_axis == "" and set(conv.conflicts) == {"curves", "log_curves", "stability_axis"}
    md = (write_leaderboard(runset(results), "s", folder=tmp_path / "lb") / "README.md").read_text()
    assert "> **Runs disagree on the task's conventions**" in md and "`stability_axis`: \"warmup\" vs \"lr\"" in md
    flipped = [result("quest", 0, 0.5), result("quest", 1, 0.5, directions={"score": False})]
    with pytest.raises(ValueError, match="disagree on whether higher is better for 'score'"):
        of_runs("probe (tiny)", flipped)


def test_records_without_conventions_are_read_with_the_task_s_declaration(tmp_path):
    old = [result(v, s, 0.5 + 0.1 * s, conventions={}, task="spurious", directions={"score": True})
           for v in ("softmax", "quest") for s in range(2)]
    conv = of_runs("spurious (tiny)", old)
    assert conv.curves == get_task("spurious").conventions()["curves"] and conv.undeclared == 4
    md = (write_leaderboard(runset(old), "s", folder=tmp_path / "lb") / "README.md").read_text()
    assert "spurious (tiny): 4 of 4 runs' records hold none (written before results stored them), read with the " \
        "installed task's declaration" in md
    unknown = [result(v, 0, 0.5, conventions={}, task="not-installed") for v in ("softmax", "quest")]
    conv = of_runs("not-installed (tiny)", unknown)
    assert conv.curves == list(Task.curve_keys) and conv.robustness_metric == "corrupted_score"  # its own metrics


def test_the_runner_stores_the_task_s_conventions_in_each_result(tmp_path, monkeypatch):
    from quest_bench.runner import execute
    from quest_bench.spec import RunSpec

    monkeypatch.setenv("QUEST_BENCH_FAULTS", "diverge_at_step=2")  # a result after two steps
    spec = RunSpec("spurious", "softmax", "tiny", 0, {"steps": 4, "warmup_steps": 1}, "x")
    r = execute(spec, tmp_path, progress=False)
    assert r.status == "diverged" and r.conventions == get_task("spurious").conventions()
    assert RunResult.from_dict(json.loads(r.to_json())).conventions["curves"][-1] == "biased_answer_key_norm"


def test_stage_one_of_a_confirming_suite_refuses_runs_that_disagree_on_the_direction():
    from quest_bench import tuning
    from quest_bench.spec import RunSpec

    specs = [RunSpec("probe", "quest", "tiny", seed, {"warmup": 0.1}, "x") for seed in range(2)]
    results = {s.run_id: RunResult(run_id=s.run_id, task="probe", task_version="1", variant="quest", preset="tiny",
                                   seed=s.seed, overrides=s.overrides, status="ok", primary_metric="score",
                                   higher_is_better=s.seed == 0, metrics={"score": 0.5}) for s in specs}
    with pytest.raises(ValueError, match=r"probe \(tiny\) / quest disagree on whether higher is better for 'score'"):
        tuning.stage_one_choices(specs, results, ("warmup",))
    results[specs[1].run_id].higher_is_better = True
    assert tuning.stage_one_choices(specs, results, ("warmup",))[("probe", "tiny", "quest")][2] is True


def test_a_composed_cell_s_numbers_become_numeric_columns_beside_its_text(tmp_path):
    table = Table([Text("variant"), Text("Δ [interval]")],
                  [["quest", Text("+0.014 [-0.0156, +0.0435]", data={"mean": 0.014, "low": -0.0156, "high": 0.0435})],
                   ["softmax", Text("—")]])
    page = Page(["## Sec", "", table])
    assert page.markdown().splitlines()[4] == "| quest | +0.014 [-0.0156, +0.0435] |"  # the page shows the text
    write_data(page.tables, tmp_path, slug)
    rows = list(csv.reader(open(tmp_path / "01-Sec.csv", newline="")))
    assert rows == [["variant", "Δ [interval]", "Δ [interval]: mean", "Δ [interval]: low", "Δ [interval]: high"],
                    ["quest", "+0.014 [-0.0156, +0.0435]", "0.014", "-0.0156", "0.0435"],
                    ["softmax", "—", "", "", ""]]
    assert json.loads((tmp_path / "01-Sec.json").read_text())[1] == {
        "variant": "softmax", "Δ [interval]": "—", "Δ [interval]: mean": None, "Δ [interval]: low": None,
        "Δ [interval]: high": None}


def test_the_leaderboard_data_files_hold_the_statistics_as_numbers(tmp_path):
    import statistics

    from scipy import stats as sps

    diffs = [0.05, 0.06, 0.09, 0.14, 0.21]
    results = [result(v, s, 0.5 + 0.1 * s + (diffs[s] if v == "quest" else 0.0)) for v in ("softmax", "quest")
               for s in range(5)]
    folder = write_leaderboard(runset(results), "s", folder=tmp_path / "lb")
    files = sorted((folder / "tables").glob("[0-9][0-9]-*.csv"))
    assert files
    for path in files:
        rows = list(csv.reader(open(path, newline="")))
        header = rows[0]
        for i, name in enumerate(header):
            if not any(name.startswith(f"{g}: ") for g in header[:i]):
                continue  # a text column (a name, a label, or what the page shows)
            for row in rows[1:]:
                assert row[i] == "" or math.isfinite(float(row[i])), (path.name, name, row[i])
    task = next(p for p in files if "probe" in p.name)
    row = {r["variant"]: r for r in csv.DictReader(open(task, newline=""))}["quest"]
    scores = [0.5 + 0.1 * s + diffs[s] for s in range(5)]
    assert float(row["score mean ± std: mean"]) == pytest.approx(statistics.mean(scores))
    assert float(row["score mean ± std: std"]) == pytest.approx(statistics.stdev(scores))
    low, high = sps.t.interval(0.95, len(diffs) - 1, loc=statistics.mean(diffs), scale=sps.sem(diffs))
    assert float(row["Δ vs softmax: mean"]) == pytest.approx(statistics.mean(diffs))
    assert (float(row["Δ vs softmax: low"]), float(row["Δ vs softmax: high"])) == pytest.approx((low, high))
    assert int(row["Δ vs softmax: n"]) == 5
