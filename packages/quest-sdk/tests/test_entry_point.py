"""A task's entry point is a "module:function" string, imported when a run starts; a bad one is a clear error."""

import sys
import types

import pytest

from quest_sdk.task import Task, TaskOutput, load_entry_point


class Echo(Task):
    name, version, primary_metric = "echo", "1", "value"
    entry_point = "echo_task_module:run"


def test_run_imports_and_calls_the_declared_function(monkeypatch):
    module = types.ModuleType("echo_task_module")
    module.run = lambda config, ctx: TaskOutput({"config": float(config), "ctx": float(ctx)})
    monkeypatch.setitem(sys.modules, "echo_task_module", module)
    assert Echo().run(2, 3).metrics == {"config": 2.0, "ctx": 3.0}
    monkeypatch.delitem(sys.modules, "echo_task_module")
    with pytest.raises(ValueError, match=r"^task 'echo': entry_point 'echo_task_module:run': no module"):
        Echo().run(2, 3)


@pytest.mark.parametrize("text, message", [
    ("quest_sdk.engine", r"^task 'x': entry_point 'quest_sdk.engine' is not 'module:function'"),
    ("quest_sdk.engine:", r"^task 'x': entry_point 'quest_sdk.engine:' is not 'module:function'"),
    ("quest sdk:run", r"^task 'x': entry_point 'quest sdk:run' is not 'module:function'"),
    ("quest_sdk.no_such:run", r"^task 'x': entry_point 'quest_sdk.no_such:run': no module 'quest_sdk.no_such'$"),
    ("quest_sdk.engine:nothing", r"^task 'x': entry_point '.*': module 'quest_sdk.engine' has no function 'nothing'$"),
    ("quest_sdk.engine:CHECKPOINT_VERSION", r"has no function 'CHECKPOINT_VERSION'$"),
    ("", r"^task 'x' declares no entry_point \('module:function'\) and does not override run$"),
])
def test_a_bad_entry_point_names_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        load_entry_point(text, "task 'x'")


def test_a_malformed_entry_point_fails_when_the_class_is_defined():
    with pytest.raises(ValueError, match=r"^Broken: entry_point 'experiment.run' is not 'module:function'"):
        class Broken(Task):
            entry_point = "experiment.run"
