"""The researcher's commands: config, suites, runs, show, compare, export, run --spec, leaderboard over ad-hoc and
merged runs, and a `tasks` that imports no task stack."""

import csv
import json
import subprocess
import sys

import pytest

from quest_bench.cli import main
from quest_bench.result import RunResult
from quest_bench.runner import resolve
from quest_bench.spec import RunSpec
from quest_bench.store import Store

FAST = ["--set", "steps=30", "--set", "warmup_steps=5", "--set", "eval_samples=200", "--quiet"]


def fake_run(store, variant, seed, value, status="ok", lr=0.003):
    spec = resolve(RunSpec("spurious", variant, "tiny", seed, {"lr": lr}))  # as a sweep of this checkout would
    result = RunResult(run_id=spec.run_id, task="spurious", task_version="2", variant=variant, preset="tiny",
                       seed=seed, overrides={"lr": lr}, status=status, primary_metric="robust_fraction",
                       metrics={"robust_fraction": value, "unbiased_acc": 0.3 + value / 10} if status == "ok" else {},
                       config={"lr": lr, "steps": 1500}, cost={"wall_s": 12.0 + seed},
                       reason="" if status == "ok" else "RuntimeError: boom")
    store.write(spec, result)
    return result


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    a, b = Store(root / "suite-a"), Store(root / "suite-b")
    runs = [fake_run(a, "softmax", 0, 0.4), fake_run(a, "quest", 0, 0.6), fake_run(a, "quest", 1, 0.0, "failed"),
            fake_run(b, "softmax", 1, 0.5, lr=0.01), fake_run(b, "quest", 1, 0.7, lr=0.01)]
    return root, runs


def test_config_shows_values_types_ranges_and_meanings(capsys):
    assert main(["config", "spurious", "--preset", "small", "--set", "lr=0.01"]) == 0
    out = capsys.readouterr().out
    steps = next(line for line in out.splitlines() if line.startswith("*steps"))
    assert "3000" in steps and "int" in steps and ">= 1" in steps  # the small preset's value, its type and range
    lr = next(line for line in out.splitlines() if line.startswith("*lr"))
    assert "0.01" in lr and "> 0" in lr
    assert "N tokens per sample" in out  # the comment beside the field in the config class
    assert main(["config", "speech-commands", "--format", "json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["config"]}
    assert rows["narrowband"]["comment"].endswith("without this the check reads 0/10")  # a two-line comment
    assert rows["dataset"]["valid"] == "one of 'synth', 'speechcommands'"
    assert main(["config", "lm", "--format", "yaml"]) == 0
    assert "context: 64" in capsys.readouterr().out
    assert main(["config", "lm", "--set", "contxt=8"]) == 2
    assert "Did you mean 'context'?" in capsys.readouterr().err


def test_suites_lists_sizes_and_estimates_cost_from_earlier_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs" / "suites").mkdir(parents=True)
    (tmp_path / "configs" / "suites" / "mine.yaml").write_text(
        "name: mine\ntasks: [spurious]\nvariants: [softmax, quest]\nseeds: [0, 1]\noverrides: {lr: 0.003}\n")
    store = Store(tmp_path / "results" / "mine")
    fake_run(store, "softmax", 0, 0.4)  # one of the suite's 4 runs, 12 s
    assert main(["suites"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("mine "))
    assert " 4 " in row and "spurious" in row and "~48 s (1 measured, 3 from similar runs)" in row
    assert not any(line.startswith("smoke ") for line in out.splitlines())  # the project folder's only, no checkout's


def test_runs_lists_and_filters(results, capsys):
    root, runs = results
    assert main(["runs", "--results", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("5 runs") and "robust_fraction=0.6" in out and "RuntimeError: boom" in out
    assert main(["runs", "--results", str(root), "--suite", "suite-b", "--variant", "quest"]) == 0
    assert capsys.readouterr().out.strip().endswith("1 runs")
    assert main(["runs", "--results", str(root), "--status", "failed"]) == 0
    assert runs[2].run_id in capsys.readouterr().out
    assert main(["runs", "--results", str(root), "--suite", "nope"]) == 2
    assert "suites with results: suite-a, suite-b" in capsys.readouterr().err


def test_show_and_compare(results, capsys):
    root, runs = results
    assert main(["show", runs[1].run_id[:6], "--results", str(root)]) == 0
    out = capsys.readouterr().out
    assert runs[1].run_id in out and "* robust_fraction" in out and "spec.json" in out and "result.json" in out
    assert main(["show", "abc", "--results", str(root)]) == 2
    assert "at least 4 characters" in capsys.readouterr().err
    assert main(["compare", runs[0].run_id, runs[4].run_id, "--results", str(root)]) == 0
    out = capsys.readouterr().out
    lr_row = next(line for line in out.splitlines() if line.strip().startswith("lr"))
    assert "≠" in lr_row and "0.003" in lr_row and "0.01" in lr_row  # the differing config key is marked
    assert not any(line.strip().startswith("steps") for line in out.splitlines())  # equal keys hidden
    assert main(["compare", runs[0].run_id, "--results", str(root)]) == 2


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_export_writes_one_flat_row_per_run(results, fmt, tmp_path, capsys):
    root, runs = results
    out = tmp_path / f"out.{fmt}"
    assert main(["export", "--suite", "suite-a", "--suite", "suite-b", "--format", fmt, "--out", str(out),
                 "--results", str(root)]) == 0
    if fmt == "csv":
        rows = list(csv.DictReader(out.open()))
    elif fmt == "json":
        rows = json.loads(out.read_text())
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
    assert len(rows) == 5
    quest = next(r for r in rows if r["run_id"] == runs[1].run_id)
    assert float(quest["metric.robust_fraction"]) == 0.6 and float(quest["config.lr"]) == 0.003
    assert quest["suite"] == "suite-a" and float(quest["cost.wall_s"]) == 12.0


def test_run_spec_repeats_a_run_exactly_with_its_threads_and_data_root(tmp_path, capsys):
    first = tmp_path / "results" / "adhoc" / "first"
    assert main(["run", "spurious", "--attention", "qnorm", "--seed", "3", "--threads", "1", "--out", str(first),
                 *FAST]) == 0
    record = json.loads((first / "spec.json").read_text())
    assert record["torch_threads"] == 1 and "data_root" in record
    again = tmp_path / "again"
    assert main(["run", "--spec", str(first / "spec.json"), "--out", str(again), "--quiet"]) == 0
    a, b = (json.loads((f / "result.json").read_text()) for f in (first, again))
    assert (a["run_id"], a["metrics"]) == (b["run_id"], b["metrics"])
    assert b["env"]["torch_threads"] == 1
    assert main(["run", "--spec", str(first / "spec.json"), "--seed", "4"]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    assert main(["run"]) == 2


def test_a_run_uses_its_preset_s_thread_count_unless_told_and_restores_torch_s(tmp_path):
    import torch

    before = torch.get_num_threads()
    assert main(["run", "spurious", "--out", str(tmp_path / "preset"), "--quiet", *FAST]) == 0
    assert main(["run", "spurious", "--threads", "2", "--out", str(tmp_path / "two"), "--quiet", *FAST]) == 0
    threads = [json.loads((tmp_path / f / "result.json").read_text())["env"]["torch_threads"] for f in ("preset", "two")]
    assert threads == [1, 2]  # tiny declares 1 CPU: the same count as a sweep's worker
    assert torch.get_num_threads() == before


def test_leaderboard_over_adhoc_runs_and_merged_suites(results, tmp_path, capsys):
    root, _ = results
    for variant in ("softmax", "quest"):
        assert main(["run", "spurious", "--attention", variant, "--out", str(root / "adhoc" / variant), *FAST]) == 0
    assert main(["leaderboard", "--adhoc", "--results", str(root)]) == 0
    md = (root / "adhoc" / "leaderboard" / "README.md").read_text()
    assert "| softmax | 1 |" in md and "| quest | 1 |" in md
    assert main(["leaderboard", "--suite", "suite-a", "--suite", "suite-b", "--results", str(root)]) == 0
    merged = next(root.glob("merged-*/leaderboard/README.md")).read_text()
    assert "| softmax | 2 |" in merged and "| quest | 2 |" in merged  # one run of each from each suite


def test_tasks_imports_no_task_stack():
    code = ("import sys; from quest_bench.cli import main; main(['tasks']); "
            "print(sorted(m for m in ('torch', 'mmseg', 'mmengine', 'timm', 'ray', 'torchaudio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_the_progress_bar_shows_the_latest_loss(tmp_path):
    from quest_sdk.task import RunContext

    ctx = RunContext(tmp_path, "quest", progress=True)
    with ctx.bar(10, "x") as bar:
        ctx.log(3, {"loss": 1.23456, "max_logit": 2.0})
        assert "loss=1.235" in bar.postfix and bar.unit == "step"
    ctx.close()
