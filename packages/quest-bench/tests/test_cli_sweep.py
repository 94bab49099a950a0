"""Sweeps shaped on the command line (a suite made from --task/--variants/--seeds/--preset/--set/--grid, named and
recorded like a file suite), and `runs`/`export`/`leaderboard` accepting what `sweep` accepts; outputs: the
overrides column, `export --out -`, TensorBoard names and hparams; a missing results folder is an error."""

import csv
import io
import json
import os

import pytest

from quest_bench import cli
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store
from quest_bench.suite import cli_suite, load_suite, parse_grid, parse_seeds, record_cli_suite
from quest_bench.sweep import link_tensorboard

SHAPE = ["--task", "spurious", "--variants", "softmax,quest", "--seeds", "0-1", "--grid", "lr=1e-3,3e-3"]


def test_seeds_and_grid_parse_as_a_suite_file_would_hold_them():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4] and parse_seeds("0,2,5") == [0, 2, 5] and parse_seeds("3") == [3]
    with pytest.raises(ValueError, match="--seeds expects integers"):
        parse_seeds("a-b")
    with pytest.raises(ValueError, match="names no seed"):
        parse_seeds("4-0")
    assert parse_grid(["lr=1e-3,0.003", "steps=40"]) == {"lr": ["1e-3", 0.003], "steps": [40]}
    with pytest.raises(ValueError, match="--grid expects key=value1,value2"):
        parse_grid(["lr"])


def test_a_command_line_suite_expands_like_a_file_and_its_name_follows_canonical_values(tmp_path):
    suite, raw = cli_suite("spurious", "softmax,quest", "0-1", "tiny", {"steps": 40, "warmup_steps": 4},
                           {"lr": ["1e-3", "3e-3"]})
    assert len(suite.specs) == 8 and {s.overrides["lr"] for s in suite.specs} == {0.001, 0.003}
    same, _ = cli_suite("spurious", "softmax,quest", "0-1", "tiny", {"steps": "40", "warmup_steps": "4"},
                        {"lr": [0.001, 0.003]})
    assert same.name == suite.name and suite.name.startswith("spurious-cli-")
    other, _ = cli_suite("spurious", "softmax,quest", "0-2", "tiny", {"steps": 40, "warmup_steps": 4},
                         {"lr": [0.001, 0.003]})
    assert other.name != suite.name
    path = record_cli_suite(suite, raw, tmp_path)
    assert path == tmp_path / suite.name / "suite.yaml"
    assert {s.run_id for s in load_suite(str(path)).specs} == {s.run_id for s in suite.specs}  # a suite file
    other.name = suite.name
    with pytest.raises(ValueError, match="holds the runs of another suite of that name"):
        record_cli_suite(other, raw | {"seeds": [0, 1, 2]}, tmp_path)


def test_sweep_needs_a_suite_or_a_task_and_shape_options_need_a_task(tmp_path, capsys):
    assert cli.main(["sweep", "--results", str(tmp_path)]) == 2
    assert "sweep needs --suite NAME|FILE, or --task TASK" in capsys.readouterr().err
    assert cli.main(["sweep", "--seeds", "0-4", "--results", str(tmp_path)]) == 2
    assert "--seeds shapes a suite on the command line and needs --task TASK" in capsys.readouterr().err
    assert cli.main(["sweep", *SHAPE, "--results", str(tmp_path / "r"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("suite spurious-cli-") and "8 runs, 8 to run" in out


def finished(tmp_path):
    """The results a finished `sweep` of SHAPE leaves (written without Ray), with its recorded definition."""
    suite, raw = cli_suite("spurious", "softmax,quest", "0-1", "tiny", {}, {"lr": ["1e-3", "3e-3"]})
    results = tmp_path / "results"
    record_cli_suite(suite, raw, results)
    store = Store(results / suite.name)
    for n, spec in enumerate(suite.specs):
        store.write(spec, RunResult(run_id=spec.run_id, task=spec.task, task_version="4", variant=spec.variant,
                                    preset=spec.preset, seed=spec.seed, overrides=dict(spec.overrides), status="ok",
                                    primary_metric="robust_fraction", metrics={"robust_fraction": 0.5 + n / 100},
                                    validation_metric="val_robust_fraction"))
    return suite, results


def test_runs_and_export_accept_the_sweep_s_options_and_its_file(tmp_path, capsys):
    suite, results = finished(tmp_path)
    assert cli.main(["runs", *SHAPE, "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.count(suite.name) == 8 and "lr=0.001" in out and "lr=0.003" in out and "overrides" in out
    assert cli.main(["runs", "--suite", str(results / suite.name / "suite.yaml"), "--results", str(results)]) == 0
    assert capsys.readouterr().out.count(suite.name) == 8
    assert cli.main(["export", *SHAPE, "--results", str(results), "--out", "-"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert len(rows) == 8 and {r["override.lr"] for r in rows} == {"0.001", "0.003"}
    assert captured.err.strip() == "8 runs" and not (tmp_path / "-").exists() and not os.path.exists("-")
    assert cli.main(["export", "--suite", suite.name, "--results", str(results), "--format", "json",
                     "--out", "-"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 8


def test_the_leaderboard_accepts_the_sweep_s_options(tmp_path, capsys):
    suite, results = finished(tmp_path)
    out = tmp_path / "board"
    assert cli.main(["leaderboard", *SHAPE, "--results", str(results), "--out", str(out)]) == 0
    page = (out / "README.md").read_text()
    assert f"# Leaderboard: {suite.name}" in page and "8 runs" in page
    assert "| softmax | 4 |" in page and "| quest | 4 |" in page  # 2 seeds x 2 learning rates each
    assert cli.main(["leaderboard", "--task", "spurious", "--variants", "softmax,quest", "--seeds", "0-2",
                     "--grid", "lr=1e-3,3e-3", "--results", str(results), "--out", str(tmp_path / "b2")]) == 2
    assert "no results" in capsys.readouterr().err.lower()  # another shape is another suite, never these runs


def test_a_missing_results_folder_is_an_error(tmp_path, capsys):
    for command in (["runs"], ["export", "--adhoc"], ["show", "abcd"], ["leaderboard", "--adhoc"]):
        assert cli.main([*command, "--results", str(tmp_path / "nonexistent")]) == 2
        assert f"no results folder {tmp_path / 'nonexistent'}" in capsys.readouterr().err


def test_tensorboard_names_each_run_by_what_it_is(tmp_path):
    store = Store(tmp_path / "s")
    spec = RunSpec("spurious", "quest", "tiny", 3, {"lr": 0.003}, "v")
    (store.run_dir(spec.run_id) / "tensorboard").mkdir(parents=True)
    link = link_tensorboard(store, spec)
    assert link == tmp_path / "s" / "tensorboard" / "spurious" / "quest" / "tiny" / "seed3[lr=0.003]"
    assert link.resolve() == (store.run_dir(spec.run_id) / "tensorboard").resolve()
    assert not os.path.isabs(os.readlink(link))  # the results folder can move
    assert link_tensorboard(store, spec) == link  # again: the same link


def test_a_run_s_tensorboard_holds_its_hparams_and_final_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from quest_sdk.task import RunContext

    ctx = RunContext(tmp_path, "quest", 0, progress=False)
    ctx.log(1, {"loss": 1.0})
    ctx.final({"task": "spurious", "seed": 0, "override.lr": 0.003}, {"acc": 0.9, "nan": float("nan")})
    ctx.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss", "final/acc"}
    assert "_hparams_/session_start_info" in events.summary_metadata
