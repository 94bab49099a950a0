"""Suites: YAML files that expand into run specs (tasks × variants × presets × seeds × grid of overrides).

    name: spurious                 # results go to <results>/<name>/
    description: ...
    tasks: [spurious]              # names, or {name: ..., overrides: {...}, grid: {...}} for per-task settings
    variants: [softmax, quest]     # or `all`: every registered quest_core variant
    presets: [tiny]
    seeds: [0, 1, 2]
    overrides: {steps: 800}        # task config keys set in every run
    grid: {lr: [1e-3, 1e-2]}       # cartesian product of task config values
    tune: [lr]                     # grid keys that are a tuning search space (a `-tuned` suite): per variant the
                                   # leaderboard picks the best cell on the task's validation metric
    confirm: {seeds: 10}           # tune, then confirm: once the search (stage 1, >= 3 seeds) has finished, each
                                   # variant's chosen cell runs again with 10 fresh seeds (or a list of them), paired
                                   # with softmax's; the verdicts use those (docs/statistics.md)
"""

from __future__ import annotations

import difflib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from quest_bench import tuning
from quest_bench.result import MAX_DEPTH, SEED_MAX, depth
from quest_bench.runner import REPO_ROOT, resolve
from quest_bench.spec import RunSpec, check_name

SUITE_KEYS = {"name", "description", "tasks", "variants", "presets", "seeds", "overrides", "grid", "tune", "confirm"}
TASK_KEYS = {"name", "overrides", "grid", "presets"}


@dataclass
class Suite:
    name: str
    description: str
    specs: list[RunSpec]
    tune: tuple[str, ...] = ()  # the grid keys searched per variant (an equal tuning budget); () = not tuned
    confirm: tuple[int, ...] = ()  # stage 2's fresh seeds (tuning.confirmation_specs); () = no confirmation stage


def find_suite(name_or_path: str) -> Path:
    """A path to a suite file, or a name looked up in ./configs/suites and the repo's configs/suites."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not path.exists():
            raise ValueError(f"suite file {name_or_path!r} does not exist")
        return path
    known = known_suites()
    if name_or_path in known:
        return known[name_or_path]
    close = difflib.get_close_matches(name_or_path, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown suite {name_or_path!r}; known suites: {', '.join(known) or '(none)'}.{hint}")


def known_suites() -> dict[str, Path]:
    """Suite files by name: ./configs/suites first, then the repository's configs/suites."""
    out = {}
    for folder in (Path.cwd() / "configs" / "suites", REPO_ROOT / "configs" / "suites"):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            out.setdefault(path.stem, path)
    return dict(sorted(out.items()))


def suite_name(name_or_path: str) -> str:
    """The results name of a suite given by file path or by name (a bare name needs no suite file)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        path = find_suite(name_or_path)
        return check_name("suite", read_yaml(path).get("name") or path.stem)
    return check_name("suite", name_or_path)


def read_yaml(path: Path) -> dict:
    """A suite file as a mapping; unreadable files and malformed YAML fail with one line that says where."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read suite file {path}: {err.strerror}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a suite") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}: not valid YAML{where}: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a suite is a YAML mapping (name, tasks, variants, ...), got {type(raw).__name__}")
    return raw


def as_list(path: Path, raw: dict, key: str, default: list) -> list:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        raise ValueError(f"{path}: {key!r} must be a list, got {value!r}")
    return value


def load_suite(name_or_path: str) -> Suite:
    path = find_suite(name_or_path)
    raw = read_yaml(path)
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown suite keys {sorted(unknown)}; valid keys: {sorted(SUITE_KEYS)}")
    for key in ("tasks", "variants"):
        if not raw.get(key):
            raise ValueError(f"{path}: suite needs a non-empty {key!r} list")
    name = check_name("suite", str(raw.get("name") or path.stem))
    if raw.get("variants") == "all":
        import quest_core

        raw["variants"] = quest_core.list_variants()
    variants = as_list(path, raw, "variants", [])
    seeds = as_list(path, raw, "seeds", [0])
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= SEED_MAX for s in seeds):
        raise ValueError(f"{path}: 'seeds' must be a list of integers from 0 to {SEED_MAX}, got {seeds!r:.200}")
    for key in ("overrides", "grid"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ValueError(f"{path}: {key!r} must be a mapping of task config keys, got {raw[key]!r}")
    tune = as_list(path, raw, "tune", [])
    confirm = tuning.confirm_seeds(str(path), raw["confirm"], seeds, tune, variants) if "confirm" in raw else ()
    specs: list[RunSpec] = []
    for entry in as_list(path, raw, "tasks", []):
        if not isinstance(entry, (str, dict)) or (isinstance(entry, dict) and "name" not in entry):
            raise ValueError(f"{path}: a task entry is a name or a mapping with 'name', got {entry!r}")
        entry = {"name": entry} if isinstance(entry, str) else dict(entry)
        if set(entry) - TASK_KEYS:
            raise ValueError(f"{path}: unknown keys {sorted(set(entry) - TASK_KEYS)} in task entry; valid: {sorted(TASK_KEYS)}")
        for key in ("overrides", "grid"):
            if not isinstance(entry.get(key) or {}, dict):
                raise ValueError(f"{path}: {key!r} of task {entry['name']!r} must be a mapping, got {entry[key]!r}")
        fixed = {**(raw.get("overrides") or {}), **(entry.get("overrides") or {})}
        grid = {**(raw.get("grid") or {}), **(entry.get("grid") or {})}
        missing = [k for k in tune if k not in grid or len(grid[k]) < 2]
        if missing:
            raise ValueError(f"{path}: tune keys {missing} need a grid of at least 2 values for task {entry['name']!r} "
                             "(tune names the grid keys each variant searches)")
        presets = entry.get("presets") or as_list(path, raw, "presets", ["tiny"])
        for preset, variant, seed, cell in itertools.product(presets, variants, seeds, grid_cells(grid)):
            try:
                if depth({**fixed, **cell}) > MAX_DEPTH:
                    raise ValueError(f"overrides nested more than {MAX_DEPTH} levels")
                specs.append(resolve(RunSpec(str(entry["name"]), str(variant), str(preset), seed, {**fixed, **cell})))
            except ValueError as err:
                raise ValueError(f"{path}: {err}") from None
    specs = list({spec.run_id: spec for spec in specs}.values())  # equal entries (same run_id) merged: runs once
    return Suite(name, str(raw.get("description", "")), specs, tuple(str(k) for k in tune), confirm)


def grid_cells(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = sorted(grid)
    for k in keys:
        if not isinstance(grid[k], list) or not grid[k]:
            raise ValueError(f"grid key {k!r} needs a non-empty list of values, got {grid[k]!r}")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
