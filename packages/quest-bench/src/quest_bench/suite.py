"""Suites: YAML files that expand into run specs (tasks × variants × presets × seeds × grid of overrides).

    name: spurious                 # results go to <results>/<name>/
    description: ...
    tasks: [spurious]              # names, or {name: ..., overrides: {...}, grid: {...}} for per-task settings
    variants: [softmax, quest]
    presets: [tiny]
    seeds: [0, 1, 2]
    overrides: {steps: 800}        # task config keys set in every run
    grid: {lr: [1e-3, 1e-2]}       # cartesian product of task config values
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from quest_bench.runner import REPO_ROOT, resolve
from quest_bench.spec import RunSpec

SUITE_KEYS = {"name", "description", "tasks", "variants", "presets", "seeds", "overrides", "grid"}
TASK_KEYS = {"name", "overrides", "grid", "presets"}


@dataclass
class Suite:
    name: str
    description: str
    specs: list[RunSpec]


def find_suite(name_or_path: str) -> Path:
    """A path to a suite file, or a name looked up in ./configs/suites and the repo's configs/suites."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not path.exists():
            raise ValueError(f"suite file {name_or_path!r} does not exist")
        return path
    dirs = [Path.cwd() / "configs" / "suites", REPO_ROOT / "configs" / "suites"]
    for d in dirs:
        if (d / f"{name_or_path}.yaml").exists():
            return d / f"{name_or_path}.yaml"
    known = sorted({p.stem for d in dirs if d.exists() for p in d.glob("*.yaml")})
    raise ValueError(f"unknown suite {name_or_path!r}; known suites: {', '.join(known) or '(none)'}")


def suite_name(name_or_path: str) -> str:
    """The results name of a suite given by file path or by name (a bare name needs no suite file)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        return (yaml.safe_load(find_suite(name_or_path).read_text()) or {}).get("name") or path.stem
    return name_or_path


def load_suite(name_or_path: str) -> Suite:
    path = find_suite(name_or_path)
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown suite keys {sorted(unknown)}; valid keys: {sorted(SUITE_KEYS)}")
    for key in ("tasks", "variants"):
        if not raw.get(key):
            raise ValueError(f"{path}: suite needs a non-empty {key!r} list")
    specs: list[RunSpec] = []
    for entry in raw["tasks"]:
        entry = {"name": entry} if isinstance(entry, str) else dict(entry)
        if set(entry) - TASK_KEYS:
            raise ValueError(f"{path}: unknown keys {sorted(set(entry) - TASK_KEYS)} in task entry; valid: {sorted(TASK_KEYS)}")
        fixed = {**(raw.get("overrides") or {}), **(entry.get("overrides") or {})}
        grid = {**(raw.get("grid") or {}), **(entry.get("grid") or {})}
        presets = entry.get("presets") or raw.get("presets") or ["tiny"]
        for preset, variant, seed, cell in itertools.product(
            presets, raw["variants"], raw.get("seeds") or [0], grid_cells(grid)
        ):
            specs.append(resolve(RunSpec(entry["name"], variant, preset, int(seed), {**fixed, **cell})))
    return Suite(raw.get("name") or path.stem, raw.get("description", ""), specs)


def grid_cells(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = sorted(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ValueError(f"grid key {k!r} needs a non-empty list of values, got {grid[k]!r}")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
