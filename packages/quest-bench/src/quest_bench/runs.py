"""Finished runs as a researcher browses them: the runs of suites and ad-hoc runs, found by id, listed, shown, compared
and exported (`quest-bench runs | show | compare | export`).

    <results>/<suite>/runs/<run_id>/result.json    a suite's runs (read through its index, quest_bench.store)
    <results>/adhoc/<name>/result.json             `quest-bench run`'s default folders (any name)
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store

ADHOC = "adhoc"


@dataclass
class RunSet:
    """Results with the folder each run lives in (suites, ad-hoc runs, or several merged)."""

    results: list[RunResult] = field(default_factory=list)
    folders: dict[str, Path] = field(default_factory=dict)  # run_id -> folder
    suites: dict[str, str] = field(default_factory=dict)  # run_id -> suite name ("adhoc" for ad-hoc runs)
    canonical: dict[str, str] = field(default_factory=dict)  # run_id -> the id its spec has today (canonical_run_id)

    def add(self, result: RunResult, folder: Path, suite: str, canonical: str | None = None) -> None:
        """Add a run read from ``folder``; its overrides become their typed form (``canonical_run_id``)."""
        if result.run_id in self.folders:
            return  # the same run in two places (e.g. copied): listed once
        self.canonical[result.run_id] = canonical or canonical_run_id(result, Path(folder))
        self.results.append(result)
        self.folders[result.run_id] = Path(folder)
        self.suites[result.run_id] = suite

    def matching(self, run_ids: set[str]) -> set[str]:
        """The stored runs whose id, or whose spec's id today, is in ``run_ids`` (a suite's specs)."""
        return {r.run_id for r in self.results if r.run_id in run_ids or self.canonical[r.run_id] in run_ids}

    def merge(self, other: "RunSet") -> "RunSet":
        for r in other.results:
            self.add(r, other.folders[r.run_id], other.suites[r.run_id], other.canonical[r.run_id])
        return self


def canonical_run_id(result: RunResult, folder: Path) -> str:
    """The run_id of a stored run's spec with its overrides in their config fields' types
    (``registry.canonical_overrides``), as every run_id is computed since. A run written before that, with an
    override stored as text (``--set lr=3e-3`` kept "3e-3") or an integer for a float field (``1`` for 1.0), is
    stored under the id of its raw spec; its folder keeps that name, and this maps it to the id its spec has today
    (from its spec.json, with the code version recorded there), so that sweeps count it as done and the leaderboard
    and exports pair it with the runs of the same value. The result's ``overrides`` are replaced by the canonical
    ones in memory (the files are not changed). Runs whose task is not installed keep their id."""
    from quest_bench.registry import canonical_overrides, get_task

    try:
        typed = canonical_overrides(get_task(result.task), result.overrides)
    except ValueError:
        return result.run_id  # a task not installed here, or a key it no longer has
    if json.dumps(typed, sort_keys=True) == json.dumps(result.overrides, sort_keys=True):
        return result.run_id
    result.overrides = typed
    try:
        spec = RunSpec.from_json(json.loads((folder / "spec.json").read_text()))
    except (OSError, ValueError, TypeError):
        return result.run_id
    return RunSpec(spec.task, spec.variant, spec.preset, spec.seed, typed, spec.code_version).run_id


def suite_runs(results_dir: Path, suite: str) -> RunSet:
    """A suite's runs (its index is rebuilt when stale; corrupt folders are reported and skipped)."""
    store = Store(Path(results_dir) / suite)
    runs = RunSet()
    for r in store.load():
        runs.add(r, store.run_dir(r.run_id), suite)
    return runs


def adhoc_runs(results_dir: Path) -> RunSet:
    """The runs under <results>/adhoc/ (`quest-bench run`'s default folders); corrupt ones are reported, skipped."""
    runs = RunSet()
    for path in sorted((Path(results_dir) / ADHOC).glob("*/result.json")):
        try:  # checked against the result schema (RunResult.from_dict); an invalid record is skipped, never fatal
            runs.add(RunResult.from_dict(json.loads(path.read_bytes().decode("utf-8"))), path.parent, ADHOC)
        except (OSError, ValueError, TypeError, RecursionError) as err:
            message = str(getattr(err, "strerror", None) or err)[:300].replace("\n", " ")
            print(f"skipping corrupt run folder {path.parent} ({path.name}: {message})", file=sys.stderr)
    return runs


def suite_names(results_dir: Path) -> list[str]:
    """Suites with results under ``results_dir`` (folders holding a runs/ folder)."""
    root = Path(results_dir)
    return sorted(p.parent.name for p in root.glob("*/runs") if p.is_dir()) if root.is_dir() else []


def collect(results_dir: Path, suites: list[str] | None = None, adhoc: bool = False) -> RunSet:
    """Runs of the named suites and/or the ad-hoc runs; with neither, everything under ``results_dir``."""
    if not suites and not adhoc:
        suites, adhoc = suite_names(results_dir), True
    runs = RunSet()
    for suite in suites or []:
        if not (Path(results_dir) / suite / "runs").is_dir():
            known = ", ".join(suite_names(results_dir)) or "(none)"
            raise ValueError(f"no results for suite {suite!r} under {results_dir}; suites with results: {known}")
        runs.merge(suite_runs(results_dir, suite))
    if adhoc:
        runs.merge(adhoc_runs(results_dir))
    return runs


def find_run(runs: RunSet, prefix: str) -> RunResult:
    """The one run whose id starts with ``prefix`` (at least 4 characters)."""
    if len(prefix) < 4:
        raise ValueError(f"give at least 4 characters of a run id, got {prefix!r}")
    matches = [r for r in runs.results if r.run_id.startswith(prefix)]
    if not matches:
        raise ValueError(f"no run with id {prefix!r}… under the results folder (see `quest-bench runs`)")
    if len(matches) > 1:
        raise ValueError(f"run id {prefix!r} is ambiguous: {', '.join(r.run_id for r in matches)}")
    return matches[0]


def finished_at(result: RunResult, folder: Path) -> str:
    """When the run finished: recorded in the result, else the result file's time (UTC, to the minute)."""
    if result.finished_at:
        return result.finished_at[:16].replace("T", " ")
    try:
        stamp = (folder / "result.json").stat().st_mtime
    except OSError:
        return ""
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def primary_text(r: RunResult) -> str:
    value = r.metrics.get(r.primary_metric)
    return f"{r.primary_metric}={value:.4g}" if isinstance(value, (int, float)) else (r.reason or "-")[:40]


def overrides_text(r: RunResult) -> str:
    """A run's overrides as key=value pairs (what tells the cells of a grid apart), "-" for none."""
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(r.overrides.items())) or "-"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain text table with aligned columns."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def list_table(runs: RunSet, task: str | None = None, variant: str | None = None, status: str | None = None) -> str:
    """`quest-bench runs`: one row per run, oldest first."""
    chosen = [r for r in runs.results if (task is None or r.task == task) and (variant is None or r.variant == variant)
              and (status is None or r.status == status)]
    chosen.sort(key=lambda r: (finished_at(r, runs.folders[r.run_id]), r.run_id))
    rows = [[r.run_id, runs.suites[r.run_id], r.task, r.variant, r.preset, str(r.seed), overrides_text(r), r.status,
             primary_text(r), f"{r.cost['wall_s']:.0f}s" if "wall_s" in r.cost else "-",
             finished_at(r, runs.folders[r.run_id])] for r in chosen]
    header = ["run_id", "suite", "task", "variant", "preset", "seed", "overrides", "status", "primary", "wall",
              "finished (UTC)"]
    return table(header, rows) + f"\n{len(rows)} runs"


def show_text(runs: RunSet, r: RunResult) -> str:
    """`quest-bench show`: one run's spec, outcome, metrics, cost, environment and files."""
    folder = runs.folders[r.run_id]
    lines = [f"run {r.run_id}  ({runs.suites[r.run_id]})  {folder}",
             f"  {r.task} / {r.variant} / {r.preset} / seed {r.seed}   task version {r.task_version}",
             f"  overrides: {json.dumps(r.overrides, sort_keys=True) if r.overrides else '(none)'}",
             f"  status: {r.status}" + (f" ({r.reason})" if r.reason else "")
             + (f" at step {r.diverged_step}" if r.diverged_step is not None else ""),
             "metrics:"]
    lines += [f"  {'*' if k == r.primary_metric else ' '} {k:34s} {v:.6g}" for k, v in sorted(r.metrics.items())
              if isinstance(v, (int, float))]
    lines += ["cost:"] + [f"    {k:34s} {v:.6g}" for k, v in sorted(r.cost.items())]
    env = {k: r.env.get(k) for k in ("git_sha", "git_dirty", "device", "torch_threads", "data_root", "host", "python")}
    lines += ["environment:"] + [f"    {k:34s} {v}" for k, v in env.items() if v is not None]
    lines += ["    " + ", ".join(f"{k} {v}" for k, v in sorted(r.env.get("packages", {}).items()))]
    lines += ["data:"] + [f"    {k:34s} {v}" for k, v in sorted(r.data.items())]
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    lines += ["files:"] + [f"    {p.relative_to(folder)}  ({p.stat().st_size:,} bytes)" for p in files]
    error = folder / "error.txt"
    if r.status == "failed" and error.exists():
        lines += ["error.txt (last lines):"] + ["    " + x for x in error.read_text().splitlines()[-12:]]
    return "\n".join(lines)


def compare_text(runs: RunSet, chosen: list[RunResult], everything: bool = False) -> str:
    """`quest-bench compare`: runs side by side; rows where the runs differ are marked with '≠'. Config rows are
    the differing keys only unless ``everything``."""
    def section(title: str, values: dict[str, list], only_diff: bool) -> list[list[str]]:
        rows = [[title] + [""] * (len(chosen) + 1)]
        for key, cells in values.items():
            differ = len({json.dumps(c, sort_keys=True, default=str) for c in cells}) > 1
            if only_diff and not differ:
                continue
            rows.append([f"  {key}", "≠" if differ else ""] + [fmt(c) for c in cells])
        return rows

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.5g}" if isinstance(value, float) else str(value)

    ident = {k: [getattr(r, k) for r in chosen] for k in ("task", "variant", "preset", "seed", "status")}
    ident["suite"] = [runs.suites[r.run_id] for r in chosen]
    config_keys = sorted({k for r in chosen for k in r.config})
    config = {k: [r.config.get(k) for r in chosen] for k in config_keys}
    metric_keys = sorted({k for r in chosen for k in r.metrics}, key=lambda k: (k != chosen[0].primary_metric, k))
    metrics = {k: [r.metrics.get(k) for r in chosen] for k in metric_keys}
    cost = {k: [r.cost.get(k) for r in chosen] for k in sorted({k for r in chosen for k in r.cost})}
    rows = (section("run", ident, False) + section("config" + ("" if everything else " (differing keys)"), config,
                                                   not everything)
            + section("metrics", metrics, False) + section("cost", cost, False))
    return table(["", ""] + [r.run_id[:10] for r in chosen], rows)


def flat_rows(runs: RunSet) -> list[dict]:
    """One flat dict per run (for CSV/JSON/Parquet): identity, outcome, then metric.*, config.*, override.*,
    cost.*, telemetry.* and a few environment facts."""
    out = []
    for r in sorted(runs.results, key=lambda r: (runs.suites[r.run_id], r.task, r.variant, r.preset, r.seed)):
        row = {"run_id": r.run_id, "suite": runs.suites[r.run_id], "task": r.task, "task_version": r.task_version,
               "variant": r.variant, "preset": r.preset, "seed": r.seed, "status": r.status, "reason": r.reason,
               "diverged_step": r.diverged_step, "primary_metric": r.primary_metric,
               "primary_value": r.metrics.get(r.primary_metric), "higher_is_better": r.higher_is_better,
               "finished_at": finished_at(r, runs.folders[r.run_id]), "git_sha": r.env.get("git_sha"),
               "device": r.env.get("device"), "torch_threads": r.env.get("torch_threads")}
        for prefix, values in (("metric", r.metrics), ("override", r.overrides), ("config", r.config),
                               ("cost", r.cost), ("telemetry", r.telemetry)):
            row.update({f"{prefix}.{k}": v for k, v in values.items()})
        out.append(row)
    return out


EXPORT_FORMATS = ("csv", "json", "parquet")


def export(runs: RunSet, path: Path | None, fmt: str) -> int:
    """Write one row per run to ``path`` (None: standard output) as CSV, JSON (a list of objects) or Parquet;
    returns the row count."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(EXPORT_FORMATS)}")
    rows = flat_rows(runs)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        with (open(path, "w", newline="") if path is not None else nullcontext(sys.stdout)) as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "json":
        text = json.dumps(rows, indent=1, default=str) + "\n"
        path.write_text(text) if path is not None else sys.stdout.write(text)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: parquet_column([row.get(c) for row in rows]) for c in columns}),
                       path if path is not None else sys.stdout.buffer)
    return len(rows)


def parquet_column(values: list) -> list:
    """One Parquet type per column: ints stay ints, ints mixed with floats become floats, bools stay bools, anything
    else mixed (or a list) becomes JSON text. Missing values stay null."""
    present = [v for v in values if v is not None]
    kinds = {bool if isinstance(v, bool) else int if isinstance(v, int) else float if isinstance(v, float)
             else str if isinstance(v, str) else object for v in present}
    if kinds <= {int, float} and float in kinds:
        return [None if v is None else float(v) for v in values]
    if len(kinds) <= 1 and object not in kinds:
        return values
    return [None if v is None else v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            for v in values]
