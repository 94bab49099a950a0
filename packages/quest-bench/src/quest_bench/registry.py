"""Task registry: tasks register through the ``quest_bench.tasks`` entry-point group and load lazily."""

from __future__ import annotations

import difflib
from functools import cache
from importlib.metadata import entry_points, version

from quest_sdk.task import Task

GROUP = "quest_bench.tasks"


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def task_names() -> list[str]:
    """Registered task names (nothing is imported)."""
    return sorted(_entry_points())


@cache
def get_task(name: str) -> Task:
    """Import and instantiate one task; unknown names fail with the valid ones and a suggestion."""
    eps = _entry_points()
    if name not in eps:
        close = difflib.get_close_matches(name, eps, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(eps)) or '(none)'}.{hint}")
    return eps[name].load()()


def code_version(task: Task) -> str:
    """What makes results comparable: the task's version and quest-core's version (part of the run_id)."""
    return f"{task.name}={task.version};quest-core={version('quest-core')}"
