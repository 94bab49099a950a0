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
from quest_bench.paths import ROOT_ENV, suites_dir
from quest_bench.runner import resolve
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
    """A path to a suite file, or a name looked up in the project's configs/suites (``quest_bench.paths``: the
    folder ``QUEST_BENCH_ROOT`` names, else the current directory)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not path.exists():
            raise ValueError(f"suite file {name_or_path!r} does not exist (looked for {path.absolute()})")
        return path
    known = known_suites()
    if name_or_path in known:
        return known[name_or_path]
    close = difflib.get_close_matches(name_or_path, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown suite {name_or_path!r}; known suites: {', '.join(known) or '(none)'}.{hint} (looked "
                     f"for {name_or_path}.yaml in {suites_dir()}: run from the project folder, set {ROOT_ENV} to it, "
                     "or give the suite file's path)")


def known_suites() -> dict[str, Path]:
    """Suite files by name, from the project's configs/suites (``suites_dir``)."""
    folder = suites_dir()
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


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
    return suite_from_mapping(read_yaml(path), path)


def suite_from_mapping(raw: dict, path: Path) -> Suite:
    """A suite from its mapping (a suite file's, or ``cli_suite``'s); ``path`` names it in errors."""
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


CLI_SUITE = Path("<command line>")
RECORD = "suite.yaml"  # a command-line suite's definition, in its results folder


def parse_seeds(text: str) -> list[int]:
    """Seeds from the command line: "0-4" (both ends included), "0,2,5" or "3"."""
    seeds = []
    for part in str(text).split(","):
        first, _, last = part.strip().partition("-")
        try:
            seeds += list(range(int(first), int(last) + 1)) if last else [int(first)]
        except ValueError:
            raise ValueError(f"--seeds expects integers, a range or a comma list (0-4, 0,2,5 or 3), got {text!r}") from None
    if not seeds:
        raise ValueError(f"--seeds {text!r} names no seed (a range is first-last, first <= last)")
    return seeds


def parse_grid(pairs: list[str]) -> dict[str, list]:
    """--grid key=v1,v2,... pairs: each value a YAML scalar (typed by the task config, like --set)."""
    grid = {}
    for pair in pairs:
        key, sep, values = pair.partition("=")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not items:
            raise ValueError(f"--grid expects key=value1,value2,..., got {pair!r}")
        grid[key.strip()] = [scalar(v) for v in items]
    return grid


def scalar(text: str):
    """A command-line value as YAML reads a scalar (1e-3 stays text; the task config types it), else the text."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text


def cli_suite(task: str, variants: str = "softmax,quest", seeds: str = "0", presets: str = "tiny",
              overrides: dict | None = None, grid: dict | None = None, tune: str | None = None,
              name: str | None = None) -> tuple[Suite, dict]:
    """A suite made on the command line (``sweep --task T --variants a,b --seeds 0-4 --preset P --set k=v --grid
    lr=1e-3,3e-3``) and its definition as a suite file would hold it. Its name, unless given, is
    ``<task>-cli-<hash>`` of what it runs (canonical values: ``lr=3e-3`` and ``lr=0.003`` name one suite)."""
    raw = {"name": name or "cli", "description": "made on the command line", "tasks": [task],
           "variants": "all" if variants == "all" else [v.strip() for v in variants.split(",") if v.strip()],
           "presets": [p.strip() for p in presets.split(",") if p.strip()], "seeds": parse_seeds(seeds),
           "overrides": dict(overrides or {}), "grid": dict(grid or {})}
    if tune:
        raw["tune"] = [k.strip() for k in tune.split(",") if k.strip()]
    suite = suite_from_mapping(dict(raw), CLI_SUITE)
    if not name:
        import hashlib
        import json

        shape = sorted(json.dumps([s.variant, s.preset, s.seed, s.overrides], sort_keys=True) for s in suite.specs)
        digest = hashlib.sha256(json.dumps([task, shape, raw.get("tune", [])]).encode()).hexdigest()[:8]
        suite.name = raw["name"] = check_name("suite", f"{task}-cli-{digest}")
    return suite, raw


def record_cli_suite(suite: Suite, raw: dict, results_dir: Path) -> Path:
    """Write a command-line suite's definition to ``<results>/<name>/suite.yaml``, so that `runs`, `export` and
    `leaderboard --suite NAME` find it like a suite file; a folder recorded for another definition is refused."""
    path = Path(results_dir) / suite.name / RECORD
    if path.exists():
        earlier = suite_from_mapping(read_yaml(path), path)
        if {s.run_id for s in earlier.specs} != {s.run_id for s in suite.specs}:
            raise ValueError(f"{path.parent} holds the runs of another suite of that name ({path}); choose another "
                             "--name")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def recorded_suite(name_or_path: str, results_dir: Path) -> str:
    """``name_or_path``, or the recorded definition of the command-line suite of that name under ``results_dir``
    when no suite file has that name."""
    given = str(name_or_path)
    if Path(given).suffix in (".yaml", ".yml") or os.sep in given or given in known_suites():
        return given
    path = Path(results_dir) / given / RECORD
    return str(path) if path.is_file() else given
