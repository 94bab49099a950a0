"""Validate before writing: every `run`/`sweep` option and spec.json field is checked (types, ranges, nesting depth)
before a folder is created, with one line and exit status 2, by the same rules for `run` and `sweep`; a run folder
has one writer (`run --out` takes the folder's lock); a suite's duplicate entries run once."""

import json
import re

import pytest

from quest_bench.cli import main
from quest_bench.spec import RunSpec
from quest_bench.store import StoreLock

FAST = ["--set", "steps=30", "--set", "warmup_steps=5", "--set", "eval_samples=200", "--quiet"]

RUN_OPTIONS = {
    "threads -1": (["--threads", "-1"], r"--threads must be an integer >= 1, got -1"),
    "threads 0": (["--threads", "0"], r"--threads must be an integer >= 1"),
    "seed -1": (["--seed", "-1"], r"--seed must be an integer from 0 to 4294967295, got -1"),
    "seed 2**32": (["--seed", str(2**32)], r"--seed must be an integer from 0 to 4294967295"),
    "workers -3": (["--workers", "-3"], r"--workers must be an integer >= 1, got -3"),
    "workers 0": (["--workers", "0"], r"--workers must be an integer >= 1, got 0"),
    "checkpoint-every -5": (["--checkpoint-every", "-5"], r"--checkpoint-every must be an integer >= 0, got -5"),
    "max-failures -1": (["--max-failures", "-1"], r"--max-failures must be an integer >= 0"),
    "attention empty": (["--attention", ""], r"invalid variant name ''"),
    "preset unknown": (["--preset", "huge"], r"task 'spurious' has no preset 'huge'; valid presets: tiny, small, paper"),
}

SPEC_FIELDS = {
    "torch_threads -1": ({"torch_threads": -1}, r"'torch_threads' must be null or an integer >= 1, got -1"),
    "torch_threads abc": ({"torch_threads": "abc"}, r"'torch_threads' must be null or an integer >= 1, got 'abc'"),
    "seed true": ({"seed": True}, r"'seed' must be an integer from 0 to 4294967295, got True"),
    "seed 1e23": ({"seed": 1e23}, r"'seed' must be an integer from 0 to 4294967295"),
    "seed -1": ({"seed": -1}, r"'seed' must be an integer"),
    "preset unknown": ({"preset": "huge"}, r"task 'spurious' has no preset 'huge'; valid presets: tiny, small, paper"),
    "preset a number": ({"preset": 5}, r"'preset' must be a name \(a string\), got 5"),
    "task a number": ({"task": 5}, r"'task' must be a name"),
    "overrides nested": ({"overrides": {"a": json.loads("[" * 100 + "]" * 100)}}, r"nested at most 32 levels"),
    "data_root a list": ({"data_root": ["x"]}, r"'data_root' must be null or a path"),
}


def one_line_rc_2(capsys, argv, message):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("quest-bench: error: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err


@pytest.mark.parametrize("case", sorted(RUN_OPTIONS))
def test_run_options_are_checked_before_anything_is_written(case, tmp_path, capsys, monkeypatch):
    extra, message = RUN_OPTIONS[case]
    monkeypatch.chdir(tmp_path)
    one_line_rc_2(capsys, ["run", "spurious", *extra, *FAST], message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", sorted(SPEC_FIELDS))
def test_spec_fields_are_checked_before_anything_is_written(case, tmp_path, capsys, monkeypatch):
    fields, message = SPEC_FIELDS[case]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"task": "spurious", "variant": "quest", "preset": "tiny", "seed": 0,
                                "overrides": {}, **fields}))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    one_line_rc_2(capsys, ["run", "--spec", str(spec)], message)
    assert list(work.iterdir()) == []


def test_a_spec_nested_deeper_than_python_can_parse_is_one_line(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text('{"task": "spurious", "overrides": ' + "[" * 100000 + "]" * 100000 + "}")
    monkeypatch.chdir(tmp_path)
    one_line_rc_2(capsys, ["run", "--spec", str(spec)], r"is not a run's spec.json: nested too deeply")


SWEEP_OPTIONS = {
    "workers -1": (["--workers", "-1"], r"--workers must be an integer >= 1, got -1"),
    "workers 0": (["--workers", "0"], r"--workers must be an integer >= 1, got 0"),
    "checkpoint-every -5": (["--checkpoint-every", "-5"], r"--checkpoint-every must be an integer >= 0"),
}
SUITES = {
    "seed 1e23": ("seeds: [100000000000000000000000]", r"'seeds' must be a list of integers from 0 to 4294967295"),
    "seed true": ("seeds: [true]", r"'seeds' must be a list of integers"),
    "seed -1": ("seeds: [-1]", r"'seeds' must be a list of integers"),
    "overrides nested": ("overrides: {steps: " + "[" * 40 + "]" * 40 + "}", r"nested more than 32 levels"),
    "yaml nested too deeply": ("overrides: {steps: " + "[" * 100000 + "]" * 100000 + "}",
                               r"nested too deeply|not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(SWEEP_OPTIONS) + sorted(SUITES))
def test_sweep_options_and_suite_fields_are_checked_before_anything_is_written(case, tmp_path, capsys,
                                                                               monkeypatch):
    suite = tmp_path / "suites" / "v.yaml"
    suite.parent.mkdir()
    body = SUITES[case][0] if case in SUITES else "seeds: [0]"
    suite.write_text(f"name: v\ntasks: [spurious]\nvariants: [quest]\n{body}\n")
    extra, message = SWEEP_OPTIONS[case] if case in SWEEP_OPTIONS else ([], SUITES[case][1])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    one_line_rc_2(capsys, ["sweep", "--suite", str(suite), "--results", str(work / "results"), *extra], message)
    assert list(work.iterdir()) == []


def test_duplicate_suite_entries_run_once(tmp_path, capsys):
    from quest_bench.suite import load_suite

    suite = tmp_path / "dup.yaml"
    suite.write_text("name: dup\ntasks: [spurious, spurious, {name: spurious}]\nvariants: [quest, quest]\n"
                     "seeds: [0, 0, 1]\ngrid: {steps: [300, 300]}\n")
    specs = load_suite(str(suite)).specs
    assert len(specs) == len({s.run_id for s in specs}) == 2  # seeds 0 and 1
    assert main(["sweep", "--suite", str(suite), "--results", str(tmp_path / "results"), "--dry-run"]) == 0
    assert "2 runs, 2 to run" in capsys.readouterr().out


def test_run_out_refuses_a_folder_another_run_is_writing(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with StoreLock(out / ".lock"):  # another `run --out` of the same folder, in the middle of training
        one_line_rc_2(capsys, ["run", "spurious", "--out", str(out), *FAST],
                      r"--out .*run is in use by another run \(pid \d+ on .*\); wait for it")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    assert main(["run", "spurious", "--out", str(out), *FAST]) == 0  # free again: the lock file is no obstacle
    lines = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in lines]
    assert steps == sorted(set(steps))  # one writer: no duplicate or out-of-order steps


def leaderboard_results(tmp_path):
    from quest_bench.result import RunResult
    from quest_bench.store import Store

    store = Store(tmp_path / "results" / "board")
    for variant in ("softmax", "quest"):
        spec = RunSpec("spurious", variant, "tiny", 0, {}, "x")
        store.write(spec, RunResult(run_id=spec.run_id, task="spurious", task_version="1", variant=variant,
                                    preset="tiny", seed=0, overrides={}, status="ok", primary_metric="score",
                                    metrics={"score": 0.5}))
    return str(tmp_path / "results")


def test_leaderboard_out_writes_only_into_a_new_empty_or_earlier_leaderboard_folder(tmp_path, capsys):
    results = leaderboard_results(tmp_path)
    mine = tmp_path / "mine"
    (mine / "tables").mkdir(parents=True)
    (mine / "README.md").write_text("my project")
    (mine / "tables" / "data.csv").write_text("keep")
    one_line_rc_2(capsys, ["leaderboard", "--suite", "board", "--results", results, "--out", str(mine)],
                  r"--out .*mine is not empty and is not a leaderboard folder \(it holds README.md, tables\)")
    assert (mine / "README.md").read_text() == "my project" and (mine / "tables" / "data.csv").read_text() == "keep"
    board = tmp_path / "board"
    for _ in range(2):  # new, then its own folder again (the marker)
        assert main(["leaderboard", "--suite", "board", "--results", results, "--out", str(board)]) == 0
    assert (board / ".quest-bench-leaderboard").exists() and (board / "index.html").exists()
    (board / ".quest-bench-leaderboard").unlink()  # a folder written before the marker existed: its outputs only
    assert main(["leaderboard", "--suite", "board", "--results", results, "--out", str(board)]) == 0
    (board / "notes.txt").write_text("mine")
    (board / ".quest-bench-leaderboard").unlink()
    one_line_rc_2(capsys, ["leaderboard", "--suite", "board", "--results", results, "--out", str(board)],
                  r"is not a leaderboard folder")
    assert (board / "notes.txt").read_text() == "mine"
