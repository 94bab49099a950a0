"""One value, one run: --set, suite grid and spec values take their config field's type before the run_id is
computed; run folders written before keep counting (under the id their spec has today)."""

import json

import pytest

from quest_bench import cli
from quest_bench.registry import code_version, get_task
from quest_bench.result import RunResult
from quest_bench.runner import resolve
from quest_bench.runs import collect
from quest_bench.spec import RunSpec
from quest_bench.store import Store
from quest_bench.suite import load_suite
from quest_bench.sweep import todo_specs


def test_set_3e_3_and_0_003_are_one_float_and_one_run_id():
    as_text = resolve(RunSpec("spurious", "quest", "tiny", 0, cli.parse_sets(["lr=3e-3"])))
    as_number = resolve(RunSpec("spurious", "quest", "tiny", 0, cli.parse_sets(["lr=0.003"])))
    assert cli.parse_sets(["lr=3e-3"]) == {"lr": "3e-3"}  # YAML 1.1 reads it as text ...
    assert as_text.overrides == {"lr": 0.003} and isinstance(as_text.overrides["lr"], float)  # ... typed here
    assert as_text.run_id == as_number.run_id


def test_an_integer_for_a_float_field_and_text_for_an_int_field_are_typed():
    spec = resolve(RunSpec("spurious", "quest", "tiny", 0, {"weight_decay": 0, "steps": "40", "warmup_steps": "4"}))
    assert spec.overrides == {"weight_decay": 0.0, "steps": 40, "warmup_steps": 4}
    assert type(spec.overrides["weight_decay"]) is float and type(spec.overrides["steps"]) is int
    with pytest.raises(ValueError, match="config key 'steps' expects int, got '4e1x'"):
        resolve(RunSpec("spurious", "quest", "tiny", 0, {"steps": "4e1x"}))


def test_a_suite_grid_of_1e_3_and_0_001_is_one_cell(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("name: g\ntasks: [spurious]\nvariants: [quest]\ngrid: {lr: [1e-3, 0.001, 3e-3]}\n")
    suite = load_suite(str(path))
    assert sorted(s.overrides["lr"] for s in suite.specs) == [0.001, 0.003]  # 1e-3 and 0.001: one run


def write_old_run(store: Store, overrides: dict) -> RunSpec:
    """A finished run as written before overrides were typed: its folder named by the id of the raw spec."""
    task = get_task("spurious")
    raw = RunSpec("spurious", "quest", "tiny", 0, overrides, code_version(task))
    result = RunResult(run_id=raw.run_id, task="spurious", task_version=task.version, variant="quest",
                       preset="tiny", seed=0, overrides=dict(overrides), status="ok",
                       primary_metric=task.primary_metric, metrics={task.primary_metric: 0.9})
    store.write(raw, result)
    return raw


def test_an_old_folder_with_a_text_value_counts_as_done_and_is_paired_by_its_typed_value(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("name: old\ntasks: [spurious]\nvariants: [quest]\ngrid: {lr: [3e-3, 1e-2]}\n")
    suite = load_suite(str(path))
    store = Store(tmp_path / "results" / "old")
    old = write_old_run(store, {"lr": "3e-3"})
    new_id = next(s.run_id for s in suite.specs if s.overrides["lr"] == 0.003)
    assert old.run_id != new_id  # the folder keeps its old name ...
    assert [s.overrides["lr"] for s in todo_specs(suite, store)] == [0.01]  # ... and counts as the 0.003 run
    runs = collect(tmp_path / "results", ["old"])
    assert runs.canonical[old.run_id] == new_id and runs.matching({new_id}) == {old.run_id}
    assert runs.results[0].overrides == {"lr": 0.003}  # paired and exported as the number
    assert json.loads((store.run_dir(old.run_id) / "result.json").read_text())["overrides"] == {"lr": "3e-3"}


def test_variant_and_task_suggestions_ignore_case(tmp_path, capsys):
    assert cli.main(["run", "spurious", "--attention", "QUEST", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().endswith("Did you mean 'quest'?")
    with pytest.raises(ValueError, match="unknown task 'Spurious'.*Did you mean 'spurious'"):
        resolve(RunSpec("Spurious", "quest"))
    assert not (tmp_path / "run").exists()
