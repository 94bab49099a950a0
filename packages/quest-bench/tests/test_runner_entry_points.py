"""Every registered task names its entry point as "module:function", and the function is defined there (read from
the source: importing every task's stack here would load mmseg, torch-geometric and the nuScenes devkit)."""

import ast
import importlib.util
from pathlib import Path

import pytest

from quest_bench.registry import get_task, task_names
from quest_sdk.task import entry_point_parts


@pytest.mark.parametrize("name", task_names())
def test_each_task_declares_an_entry_point_that_exists(name):
    task = get_task(name)
    module, function = entry_point_parts(task.entry_point, f"task {name!r}")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"task {name!r}: no module {module!r}"
    tree = ast.parse(Path(spec.origin).read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, \
        f"task {name!r}: {module} defines no function {function!r}"
