"""The run folders are the truth: every record is checked against the result schema on read, an invalid one is
skipped with one line naming its file (result.json and events.jsonl alike), never fatal, and the SQLite index is a
cache brought back in line whenever it disagrees with a folder (by content, not timestamps)."""

import json
import os
import sqlite3

import pytest

from quest_bench.cli import main
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store

SUITE = "truth"


def good_result(spec: RunSpec, value: float = 0.5, status: str = "ok") -> RunResult:
    return RunResult(run_id=spec.run_id, task=spec.task, task_version="1", variant=spec.variant, preset="tiny",
                     seed=spec.seed, overrides={}, status=status, primary_metric="robust_success",
                     metrics={"robust_success": value}, cost={"wall_s": 1.0}, finished_at="2026-12-01T00:00:00+00:00")


def filled(tmp_path, seeds=(0, 1)) -> tuple[Store, list[RunSpec]]:
    store = Store(tmp_path / "results" / SUITE)
    specs = [RunSpec("spurious", v, "tiny", s, {}, "x") for v in ("softmax", "quest") for s in seeds]
    for i, spec in enumerate(specs):
        store.write(spec, good_result(spec, 0.5 + 0.01 * i))
    return store, specs


# one bad value per field type of the schema (and whole files that are not a result at all)
TAMPERED = {
    "metrics a string": ("metrics", "x"),
    "metric value a string": ("metrics", {"robust_success": "x"}),
    "metric value null": ("metrics", {"robust_success": None}),
    "seed a bool": ("seed", True),
    "seed negative": ("seed", -1),
    "seed a float": ("seed", 1e23),
    "status unknown": ("status", "done"),
    "task a path": ("task", "../../x"),
    "variant a number": ("variant", 3),
    "run_id of another folder": ("run_id", "0123456789abcdef"),
    "higher_is_better a string": ("higher_is_better", "yes"),
    "cost a list": ("cost", [1, 2]),
    "telemetry value an object": ("telemetry", {"max_logit": {"a": 1}}),
    "env a string": ("env", "x"),
    "env packages a list": ("env", {"packages": ["torch"]}),
    "overrides a list": ("overrides", ["lr", 1]),
    "config nested too deeply": ("config", {"a": json.loads("[" * 200 + "]" * 200)}),
    "diverged_step negative": ("diverged_step", -2),
    "metric_directions not booleans": ("metric_directions", {"robust_success": 1}),
    "data a list": ("data", ["dataset"]),
    "reason a number": ("reason", 5),
    "finished_at a number": ("finished_at", 5),
}
WHOLE = {
    "a JSON list": b"[]",
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "truncated": b'{"run_id": "abc", "task": ',
    "nested 100000 deep": b"[" * 100000 + b"]" * 100000,
}


def tamper(store: Store, spec: RunSpec, case: str) -> None:
    path = store.run_dir(spec.run_id) / "result.json"
    if case in WHOLE:
        path.write_bytes(WHOLE[case])
        return
    key, value = TAMPERED[case]
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case", sorted(TAMPERED) + sorted(WHOLE))
def test_an_invalid_result_is_skipped_with_one_line_naming_its_file(case, tmp_path, capsys):
    store, specs = filled(tmp_path)
    bad = specs[1]
    tamper(store, bad, case)
    loaded = store.load()
    assert sorted(r.run_id for r in loaded) == sorted(s.run_id for s in specs if s is not bad)
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    assert str(store.run_dir(bad.run_id)) in lines[0] and "result.json" in lines[0]
    with sqlite3.connect(store.db_path) as con:  # the index holds the valid ones only
        assert {r[0] for r in con.execute("SELECT run_id FROM runs")} == {r.run_id for r in loaded}
    results = str(tmp_path / "results")
    for argv in (["runs", "--results", results], ["export", "--suite", SUITE, "--results", results],
                 ["show", specs[0].run_id, "--results", results], ["runs", "--suite", SUITE, "--results", results]):
        assert main(argv) == 0, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and str(store.run_dir(bad.run_id)) in err


@pytest.mark.parametrize("case", ["metrics a string", "binary", "nested 100000 deep"])
def test_the_leaderboard_and_a_dry_run_skip_an_invalid_result(case, tmp_path, capsys):
    store, specs = filled(tmp_path)
    tamper(store, specs[1], case)
    results = str(tmp_path / "results")
    assert main(["leaderboard", "--suite", SUITE, "--results", results]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "result.json" in err
    md = (store.root / "leaderboard" / "README.md").read_text()
    assert "| softmax | 1 |" in md and "| quest | 2 |" in md
    suite = tmp_path / f"{SUITE}.yaml"
    suite.write_text(f"name: {SUITE}\ntasks: [spurious]\nvariants: [softmax, quest]\nseeds: [0, 1]\n")
    assert main(["sweep", "--suite", str(suite), "--results", results, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_an_invalid_adhoc_result_is_skipped_with_one_line(tmp_path, capsys):
    adhoc = tmp_path / "results" / "adhoc"
    for name, spec in (("good", RunSpec("spurious", "quest", "tiny", 0, {}, "x")),
                       ("bad", RunSpec("spurious", "quest", "tiny", 1, {}, "x"))):
        (adhoc / name).mkdir(parents=True)
        text = good_result(spec).to_json()
        (adhoc / name / "result.json").write_text(text.replace('"metrics": {', '"metrics": "x", "m": {')
                                                   if name == "bad" else text)
    assert main(["runs", "--results", str(tmp_path / "results")]) == 0
    out, err = capsys.readouterr()
    assert "1 runs" in out
    assert [line for line in err.splitlines() if line] == [
        line for line in err.splitlines() if str(adhoc / "bad") in line and "result.json" in line]


def test_a_tampered_index_row_is_rebuilt_from_the_folder(tmp_path):
    store, specs = filled(tmp_path)
    failed = specs[0]
    store.write(failed, good_result(failed, status="failed"))
    with sqlite3.connect(store.db_path) as con:  # the row says ok, with another number
        con.execute("UPDATE runs SET status = 'ok', primary_value = 0.99, result = replace(result, "
                    "'\"failed\"', '\"ok\"') WHERE run_id = ?", (failed.run_id,))
    assert {r.run_id: r.status for r in store.load()}[failed.run_id] == "failed"
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", (failed.run_id,)).fetchone() == ("failed",)


def test_a_run_missing_from_the_index_is_added_back(tmp_path):
    """A sweep's driver killed between a run's result.json and its index row: the next read (a sweep starts with
    one) adds the row."""
    store, specs = filled(tmp_path)
    with sqlite3.connect(store.db_path) as con:
        con.execute("DELETE FROM runs WHERE run_id = ?", (specs[0].run_id,))
    assert specs[0].run_id in {r.run_id for r in store.load(warn=False)}
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT count(*) FROM runs WHERE run_id = ?", (specs[0].run_id,)).fetchone() == (1,)


def test_a_result_restored_with_an_older_timestamp_is_seen(tmp_path, capsys):
    store, specs = filled(tmp_path)
    target = specs[0]
    path = store.run_dir(target.run_id) / "result.json"
    ok_text = path.read_text()
    failed_text = good_result(target, status="failed").to_json()
    store.load()  # the index says ok
    path.write_text(failed_text)
    os.utime(path, (1_000_000, 1_000_000))  # restored from a backup: older than the index
    assert {r.run_id: r.status for r in store.load()}[target.run_id] == "failed"
    assert main(["runs", "--status", "failed", "--results", str(tmp_path / "results")]) == 0
    assert target.run_id in capsys.readouterr().out
    path.write_text(ok_text)
    os.utime(path, (1_000_000, 1_000_000))
    assert {r.run_id: r.status for r in store.load()}[target.run_id] == "ok"


def test_an_index_of_an_older_layout_is_replaced_on_write(tmp_path, capsys):
    store = Store(tmp_path / "results" / SUITE)
    store.root.mkdir(parents=True)
    with sqlite3.connect(store.db_path) as con:
        con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, task TEXT, variant TEXT, preset TEXT, seed INTEGER,"
                    " overrides TEXT, status TEXT, primary_metric TEXT, primary_value REAL, wall_s REAL, result TEXT)")
    spec = RunSpec("spurious", "quest", "tiny", 0, {}, "x")
    store.write(spec, good_result(spec))
    assert "not updated" not in capsys.readouterr().err
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT run_id, status FROM runs").fetchall() == [(spec.run_id, "ok")]


@pytest.mark.parametrize("content", [bytes(range(256)) * 8, b'{"step": "x"}\n[1, 2]\n"text"\n{"loss": 1.0}\n'
                                     b'{"step": 3, "loss": "high"}\nnot json\n{"step": 4, "loss": 0.5}\n'])
def test_a_bad_events_file_is_skipped_with_one_line_naming_it(content, tmp_path, capsys):
    from quest_bench.leaderboard import read_events, write_leaderboard

    store, specs = filled(tmp_path)
    good = store.run_dir(specs[0].run_id) / "events.jsonl"
    good.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    bad = store.run_dir(specs[1].run_id) / "events.jsonl"
    bad.write_bytes(content)
    folder = write_leaderboard(store, SUITE)
    lines = [line for line in capsys.readouterr().err.splitlines() if "events.jsonl" in line]
    assert len(lines) == 1 and str(bad) in lines[0]
    assert (folder / "spurious-tiny-curves.png").exists()  # the good run's curves are still drawn
    rows = read_events(bad.parent)
    assert rows == ([] if content.startswith(b"\x00") else [{"step": 3}, {"step": 4, "loss": 0.5}])


def test_a_worker_result_that_does_not_fit_the_schema_is_a_failed_run_not_a_crash():
    import types

    import ray

    from quest_bench.sweep import outcome

    spec = RunSpec("spurious", "quest", "tiny", 0, {}, "x")
    data = json.loads(good_result(spec).to_json())
    data["metrics"] = {"robust_success": "high"}
    fake = types.SimpleNamespace(get=lambda ref: json.dumps(data), exceptions=ray.exceptions)
    result, error = outcome(fake, None, spec, 0)
    assert result.status == "failed" and "invalid result: field 'metrics'" in result.reason and error
