"""Task registry: tasks register through the ``quest_bench.tasks`` entry-point group and load lazily."""

from __future__ import annotations

import difflib
from functools import cache
from importlib.metadata import entry_points, version

from quest_sdk.config import typed_values
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
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(eps)) or '(none)'}."
                         f"{suggestion(name, eps)}")
    return eps[name].load()()


def suggestion(name: str, valid) -> str:
    """" Did you mean 'x'?" for the valid name closest to ``name``, ignoring case (``QUEST`` -> 'quest'); "" if
    none is close."""
    by_lower = {str(v).lower(): str(v) for v in valid}
    close = difflib.get_close_matches(str(name).lower(), by_lower, n=1)
    return f" Did you mean {by_lower[close[0]]!r}?" if close else ""


def check_variant(name: str) -> str:
    """A registered attention variant's name; unknown names fail with the valid ones and a suggestion."""
    import quest_core

    variants = quest_core.list_variants()
    if name not in variants:
        raise ValueError(f"unknown attention variant {name!r}; valid variants: {', '.join(variants)}."
                         f"{suggestion(name, variants)}")
    return name


def code_version(task: Task) -> str:
    """What makes results comparable: the task's version and quest-core's version (part of the run_id)."""
    return f"{task.name}={task.version};quest-core={version('quest-core')}"


def canonical_overrides(task: Task, overrides: dict) -> dict:
    """Overrides in their config fields' types (``quest_sdk.config.typed_values``), the form a run_id is computed
    from: ``--set lr=3e-3``, a suite's ``lr: 3e-3`` and ``lr: 0.003`` are one value, one run, one grid cell."""
    return typed_values(task.config_class, dict(overrides), f"task {task.name!r}")


def check_data(specs, data_root: str | None, look: bool = True) -> None:
    """``Task.check_data`` for each distinct (task, preset, overrides) of ``specs``, before anything runs: a missing or
    malformed data root, or one the chosen dataset ignores, is a ``ValueError`` naming the run and what to do.
    ``look=False`` (a remote cluster, whose workers see another filesystem) skips looking inside the folder."""
    import json

    seen = set()
    for spec in specs:
        key = (spec.task, spec.preset, json.dumps(spec.overrides, sort_keys=True, default=str))
        if key in seen:
            continue
        seen.add(key)
        task = get_task(spec.task)
        task.check_data(task.make_config(spec.preset, spec.overrides), data_root, look)
