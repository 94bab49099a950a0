"""The command line in-process: listing, a local run, divergence, and clear errors that write nothing."""

import json

import pytest

from quest_bench.cli import main

FAST = ["--set", "steps=30", "--set", "warmup_steps=5", "--set", "eval_samples=200", "--quiet"]


def test_tasks_lists_spurious_and_variants(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "spurious" in out and "robust_success (higher is better)" in out and "qknorm-ds" in out


def test_run_writes_spec_and_result(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "spurious", "--attention", "quest", "--preset", "tiny", "--out", str(out), *FAST]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["primary_metric"] == "robust_success"
    assert 0.0 <= result["metrics"]["unbiased_acc"] <= 1.0 and result["metrics"]["robust_success"] in (0.0, 1.0)
    assert json.loads((out / "spec.json").read_text())["run_id"] == result["run_id"]
    assert (out / "events.jsonl").read_text().count("\n") >= 2
    assert result["env"]["packages"]["torch"].startswith("2.11")
    assert "robust_success" in capsys.readouterr().out


def test_forced_divergence_is_a_result(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEST_BENCH_FAULTS", "diverge_at_step=5")
    out = tmp_path / "run"
    assert main(["run", "spurious", "--attention", "softmax", "--out", str(out), *FAST]) == 0
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["diverged_step"], result["reason"]) == ("diverged", 5, "loss is nan")


@pytest.mark.parametrize("argv, message", [
    (["run", "spurius"], "unknown task 'spurius'"),
    (["run", "spurious", "--attention", "qkorm"], "Did you mean 'qknorm'"),
    (["run", "spurious", "--set", "nope=1"], "no config key 'nope'"),
    (["run", "spurious", "--set", "steps"], "--set expects key=value"),
    (["sweep", "--suite", "no-such-suite"],  # run elsewhere than the project folder: no suites, and where it looked
     r"unknown suite 'no-such-suite'; known suites: \(none\)\. \(looked for no-such-suite\.yaml in .*configs/suites"),
    (["leaderboard", "--suite", "smoke", "--results", "/nonexistent/results"],
     "no results folder /nonexistent/results: run a sweep"),
])
def test_bad_input_fails_clearly_and_writes_nothing(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_bad_preset_is_rejected_with_the_tasks_presets(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "spurious", "--preset", "huge"]) == 2
    assert "no preset 'huge'; valid presets: tiny, small, paper" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
