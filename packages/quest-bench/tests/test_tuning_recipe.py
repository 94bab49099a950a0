"""A tuned suite's default recipe comes from the stored results: each run records the preset's own value of every key
it overrides (``RunResult.preset_values``), and ``tuning.preset_cell`` reads it without building the task."""

import json

import pytest

from quest_bench import registry, tuning
from quest_bench.result import RunResult
from quest_bench.runner import execute
from quest_bench.spec import RunSpec


def stored(overrides, config, preset_values=None):
    return RunResult(run_id="r", task="not-installed", task_version="1", variant="quest", preset="tiny", seed=0,
                     overrides=overrides, status="ok", config=config, preset_values=preset_values or {})


@pytest.fixture
def no_registry(monkeypatch):
    """Reporting must not build tasks: any look-up of one fails."""
    def refuse(name):
        raise AssertionError(f"the report built task {name!r}")

    monkeypatch.setattr(registry, "get_task", refuse)


def test_the_recipe_is_read_from_the_runs(no_registry):
    tuned = stored({"lr": 0.01}, {"lr": 0.01, "steps": 40}, {"lr": 0.003})
    assert tuning.preset_cell([tuned], ("lr",)) == {"lr": 0.003}  # the overridden key: what the preset had
    assert tuning.preset_cell([tuned], ("lr", "steps")) == {"lr": 0.003, "steps": 40}  # the other: its config value


def test_runs_that_do_not_record_the_recipe_give_none(no_registry):
    old = stored({"lr": 0.01}, {"lr": 0.01})  # written before preset_values: its config holds the override
    assert tuning.preset_cell([old], ("lr",)) is None
    assert tuning.preset_cell([old, stored({"lr": 0.03}, {"lr": 0.03}, {"lr": 0.003})], ("lr",)) == {"lr": 0.003}
    assert tuning.preset_cell([], ("lr",)) is None


def test_a_run_records_the_presets_values_of_its_overrides(tmp_path):
    task = registry.get_task("spurious")
    preset = task.make_config("tiny", {})
    overrides = {"steps": 3, "warmup_steps": 1, "eval_samples": 16, "lr": preset.lr * 2}
    spec = registry.canonical_overrides(task, overrides)
    result = execute(RunSpec("spurious", "quest", "tiny", 0, spec, "x"), tmp_path, progress=False)
    assert result.status == "ok", result.reason
    assert result.preset_values == {"steps": preset.steps, "warmup_steps": preset.warmup_steps,
                                    "eval_samples": preset.eval_samples, "lr": preset.lr}
    assert RunResult.from_dict(json.loads(result.to_json())).preset_values == result.preset_values
    assert tuning.preset_cell([result], ("lr",)) == {"lr": preset.lr}


def test_a_malformed_recipe_is_refused_on_read():
    record = {"run_id": "r", "task": "t", "variant": "quest", "status": "ok", "preset_values": [1]}
    with pytest.raises(ValueError, match="field 'preset_values'.*an object"):
        RunResult.from_dict(record)
