"""Results as data: one suite's runs published into the repository (`quest-bench publish`), and its leaderboard
regenerated from that folder alone (`quest-bench leaderboard --from`), with no results folder and no index.

    docs/results/<suite>/manifest.json     what the folder holds: suite, run count, the commit it was published from,
                                           the sha256 of each data file, the suite's tuning keys and stage-2 seeds
                        /runs.parquet      one row per run: spec (task, variant, preset, seed, overrides as JSON),
                                           status, metric.* / cost.* / telemetry.* columns, versions (task,
                                           quest-core), git sha, and the run's environment, data and config as JSON
                        /curves.parquet    the training curves the leaderboard plots: per board (task and preset),
                                           curve key, variant and step, the mean over the runs the figure shows (a
                                           tuned suite's: each variant's chosen cell); not the events files
                        /leaderboard/      the leaderboard: README.md, tables/ (CSV and JSON), figures (PNG) and the
                                           per-run figures it links (run-figures/); no index.html (it would inline
                                           every figure a second time)

``published_runs`` turns the run table back into the ``RunSet`` the leaderboard reads from a results folder, so both
paths share one code path; ``doc_problems`` checks Markdown blocks marked ``<!-- results:SUITE:TABLE -->`` …
``<!-- /results -->`` against the tables regenerated from ``docs/results/SUITE``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from quest_bench.result import RunResult
from quest_bench.runs import RunSet, parquet_column

FORMAT = "quest-bench published suite"
FORMAT_VERSION = 1
RUNS, CURVES, MANIFEST, LEADERBOARD = "runs.parquet", "curves.parquet", "manifest.json", "leaderboard"
TARGET_BYTES = 1_000_000  # a published suite should stay small enough to commit
# result fields stored as typed columns, in this order; the dict fields go to prefixed or JSON columns
SCALARS = ("run_id", "task", "task_version", "variant", "preset", "seed", "status", "reason", "diverged_step",
           "primary_metric", "higher_is_better", "validation_metric", "finished_at", "resumed_from_step",
           "schema_version")
FLAT = ("metrics", "cost", "telemetry")  # numbers by name: one column per name, "metric.<name>" and so on
PREFIX = {"metrics": "metric.", "cost": "cost.", "telemetry": "telemetry."}
JSON_FIELDS = ("overrides", "metric_directions", "conventions", "data", "config", "preset_values")
ENV_COLUMNS = ("git_sha", "git_dirty")  # columns of their own for queries; the "env" column holds them too
PRIVATE_ENV = ("pid",)  # a fact of the process that ran it, not of the run: not published (the host name stays: the
# leaderboard's provenance lists it)


def public_env(env: dict) -> dict:
    """A run's environment as published: without the process id, and with a local data root reduced to its folder
    name (an absolute path says where it ran, not what was run)."""
    out = {k: v for k, v in env.items() if k not in PRIVATE_ENV}
    if out.get("data_root"):
        out["data_root"] = Path(str(out["data_root"])).name
    return out
# a block's markers start their lines (an indented example of one is not a block)
BLOCK = re.compile(r"^<!-- results:([A-Za-z0-9._-]+):([A-Za-z0-9._,/-]+) -->\n(.*?)^<!-- /results -->", re.S | re.M)
PAIRS_BLOCK = re.compile(r"pairs/([A-Za-z0-9_-]+),([A-Za-z0-9_-]+)/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def as_json(value) -> str:
    """Compact JSON that keeps the keys' order (the leaderboard's columns follow metric_directions' order)."""
    return json.dumps(value, separators=(",", ":"))


# ---- the run table ----------------------------------------------------------------------------------------------

def run_rows(runs: RunSet, figures: dict[str, list[str]]) -> list[dict]:
    """One flat row per run, in the RunSet's order (the leaderboard's pairing and sums follow it)."""
    rows = []
    for r in runs.results:
        row = {k: getattr(r, k) for k in SCALARS}
        row.update({k: as_json(getattr(r, k)) for k in JSON_FIELDS})
        row.update({"quest_core_version": (r.env.get("packages") or {}).get("quest-core"),
                    **{k: r.env.get(k) for k in ENV_COLUMNS}, "env": as_json(public_env(r.env)),
                    "figures": as_json(figures[r.run_id]) if figures.get(r.run_id) else None})
        for name in FLAT:
            row.update({PREFIX[name] + k: v for k, v in getattr(r, name).items()})
        rows.append(row)
    fixed = [k for k in rows[0] if not k.startswith(tuple(PREFIX.values()))] if rows else []
    flat = sorted({k for row in rows for k in row} - set(fixed))  # metric.*, cost.*, telemetry.* by name
    return [{c: row.get(c) for c in fixed + flat} for row in rows]


def result_of(row: dict) -> RunResult:
    """The RunResult a run table row was made from (checked against the result schema)."""
    record = {k: row[k] for k in SCALARS if k in row and not (row[k] is None and k != "diverged_step")}
    record.update({k: json.loads(row[k]) for k in (*JSON_FIELDS, "env") if row.get(k) is not None})
    for name in FLAT:
        prefix = PREFIX[name]
        record[name] = {c[len(prefix):]: v for c, v in row.items() if c.startswith(prefix) and v is not None}
    return RunResult.from_dict(record)


def write_table(rows: list[dict], path: Path) -> None:
    """Rows as Parquet, one type per column (``runs.parquet_column``), zstd-compressed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(dict.fromkeys(k for row in rows for k in row))
    pq.write_table(pa.table({c: parquet_column([row.get(c) for row in rows]) for c in columns}), path,
                   compression="zstd")


def read_table(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


# ---- publishing -------------------------------------------------------------------------------------------------

def check_target(target: Path) -> None:
    """``target`` must be new, empty, or a published suite (its manifest says so): nothing else is replaced."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"{target} is a file; publish writes a folder there: give another --out")
    if target.is_dir() and any(target.iterdir()):
        try:
            ours = json.loads((target / MANIFEST).read_text()).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise ValueError(f"{target} is not empty and holds no published suite ({MANIFEST} with format "
                             f"{FORMAT!r}); publish replaces only a folder it wrote: choose another --out")


def publish(runs: RunSet, run_ids: set[str], suite: str, out_root: Path, tune: tuple[str, ...] = (),
            confirm: tuple[int, ...] = (), curves: dict[str, dict] | None = None) -> Path:
    """Publish the runs of ``runs`` whose ids are in ``run_ids`` (``RunSet.matching`` of the suite's specs) to
    ``out_root/suite``; returns that folder. ``curves``: the curve means of boards whose runs come from a published
    suite (``published_runs``; by board title), which has no events files to average. The folder is built aside and
    moved into place, after checking that ``leaderboard_from`` regenerates its README.md and tables byte for byte."""
    from quest_bench.leaderboard import curve_means, run_figure_path, write_leaderboard
    from quest_bench.runner import git_state

    kept = RunSet()
    for r in runs.results:
        if r.run_id in run_ids:
            kept.add(r, runs.folders[r.run_id], runs.suites[r.run_id], runs.canonical[r.run_id])
    if not kept.results:
        raise ValueError(f"suite {suite!r} has no runs to publish under the results folder; run `quest-bench sweep "
                         f"--suite {suite}` first")
    target = Path(out_root) / suite
    check_target(target)
    staging = Path(out_root) / f".{suite}.publishing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        plotted: dict[str, tuple] = {}  # board title -> (the board a curves figure shows, its curve means)

        def record(shown):
            means = (curves or {}).get(shown.title)
            plotted[shown.title] = (shown, curve_means(shown, kept.folders) if means is None else means)
            return plotted[shown.title][1]

        board = write_leaderboard(kept, suite, None, staging / LEADERBOARD, tune, confirm, record)
        (board / "index.html").unlink(missing_ok=True)
        figures = {r.run_id: [p.stem for p in sorted(kept.folders[r.run_id].glob("*.png"))
                              if (board / run_figure_path(r.run_id, p.stem)).is_file()] for r in kept.results}
        write_table(run_rows(kept, figures), staging / RUNS)
        curves = [{"board": title, "task": b.task, "preset": b.preset, "key": key, "variant": variant, "step": step,
                   "value": value} for title, (b, means) in plotted.items() for key, by_variant in means.items()
                  for variant, by_step in by_variant.items() for step, value in by_step.items()]
        if curves:
            write_table(curves, staging / CURVES)
        statuses = [r.status for r in kept.results]
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "suite": suite, "runs": len(kept.results),
                    "status": {s: statuses.count(s) for s in sorted(set(statuses))},
                    "tasks": sorted({f"{r.task} ({r.preset})" for r in kept.results}),
                    "variants": sorted({r.variant for r in kept.results}), "tune": list(tune),
                    "confirm": list(confirm), "published_from": git_state(),
                    "files": {name: sha256(staging / name) for name in (RUNS, CURVES) if (staging / name).exists()}}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        with tempfile.TemporaryDirectory() as tmp:  # the publication must regenerate its own leaderboard
            again = leaderboard_from(staging, Path(tmp) / LEADERBOARD)
            differ = [str(p.relative_to(board)) for p in [board / "README.md", *sorted((board / "tables").iterdir())]
                      if not (again / p.relative_to(board)).is_file()
                      or (again / p.relative_to(board)).read_bytes() != p.read_bytes()]
        if differ:
            raise RuntimeError(f"the published data does not regenerate the leaderboard ({', '.join(differ)} "
                               "differ): a bug in quest_bench.publish; nothing was published")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = folder_bytes(target)
    if size > TARGET_BYTES:
        print(f"warning: {target} holds {size:,} bytes, more than the {TARGET_BYTES:,} a published suite should "
              "(long curves or many per-run figures)", file=sys.stderr)
    return target


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


# ---- reading a published suite ----------------------------------------------------------------------------------

def read_manifest(folder: Path) -> dict:
    """A published suite's manifest, after checking that its data files are the ones it names (sha256)."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"{folder} is not a published suite: it has no {MANIFEST} (`quest-bench publish --suite S` "
                         "writes docs/results/S/)") from None
    except ValueError as err:
        raise ValueError(f"{folder / MANIFEST} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{folder / MANIFEST} does not describe a published suite (its format is not {FORMAT!r})")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{folder} was published in format version {manifest['format_version']}; this quest-bench "
                         f"reads up to {FORMAT_VERSION}: update it")
    for name, digest in manifest.get("files", {}).items():
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name} is missing; the manifest lists it: publish the suite again")
        if sha256(folder / name) != digest:
            raise ValueError(f"{folder / name} was changed after publishing (its sha256 is not the manifest's): "
                             "publish the suite again rather than editing it")
    return manifest


def published_runs(folder: Path, figures_dir: Path) -> tuple[RunSet, dict[str, dict], dict]:
    """A published suite as the leaderboard reads it: the RunSet of its run table (each run's folder is
    ``figures_dir/<run_id>``, where its published per-run figures are copied), the curve means by board title, and
    the manifest."""
    from quest_bench.leaderboard import run_figure_path

    folder = Path(folder)
    manifest = read_manifest(folder)
    runs = RunSet()
    for i, row in enumerate(read_table(folder / RUNS)):
        try:
            result = result_of(row)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{folder / RUNS}: row {i} is not a valid result ({err})") from None
        run_folder = Path(figures_dir) / result.run_id
        for stem in json.loads(row.get("figures") or "[]"):
            run_folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / LEADERBOARD / run_figure_path(result.run_id, stem), run_folder / f"{stem}.png")
        runs.add(result, run_folder, manifest["suite"], result.run_id)
    curves: dict[str, dict] = {}
    if (folder / CURVES).is_file():
        for row in read_table(folder / CURVES):
            by_key = curves.setdefault(row["board"], {})
            by_key.setdefault(row["key"], {}).setdefault(row["variant"], {})[row["step"]] = row["value"]
    return runs, curves, manifest


def leaderboard_from(folder: Path, out: Path | None = None) -> Path:
    """Regenerate a published suite's leaderboard from its folder alone into ``out`` (default: its leaderboard/
    folder, where index.html is then left out, as published); returns the folder written."""
    from quest_bench.leaderboard import write_leaderboard

    folder = Path(folder)
    in_place = out is None or Path(out).resolve() == (folder / LEADERBOARD).resolve()
    out = folder / LEADERBOARD if out is None else Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        runs, curves, manifest = published_runs(folder, Path(tmp))
        written = write_leaderboard(runs, manifest["suite"], None, out, tuple(manifest.get("tune", ())),
                                    tuple(manifest.get("confirm", ())), lambda shown: curves.get(shown.title, {}))
    if in_place:
        (written / "index.html").unlink(missing_ok=True)
    return written


# ---- result blocks in the documentation -------------------------------------------------------------------------

def shown(cell: str) -> str:
    """A CSV cell as a Markdown table shows it: a decimal number to 4 significant digits (the CSV keeps it in full),
    anything else (integers, text) as it is."""
    try:
        value = float(cell)
    except ValueError:
        return cell
    return cell if cell.lstrip("+-").isdigit() or not math.isfinite(value) else f"{value:.4g}"


def markdown_table(csv_path: Path) -> str:
    """A leaderboard table (its CSV) as a Markdown table, each cell as ``shown`` gives it: the text columns the
    page shows, without the numeric columns ``"<header>: <key>"`` that expand a composed column (report_tables)."""
    from quest_bench.leaderboard import md

    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return ""
    shown_at = [i for i, h in enumerate(rows[0])
                if not any(h.startswith(f"{g}: ") for g in rows[0][:i])]  # an expansion follows its text column
    rows = [[row[i] for i in shown_at] for row in rows]
    line = lambda cells: "| " + " | ".join(md(shown(c), limit=10_000) for c in cells) + " |"  # noqa: E731
    return "\n".join([line(rows[0]), "|" + "---|" * len(rows[0]), *map(line, rows[1:])]) + "\n"


def table_file(tables: Path, table: str) -> Path | None:
    """The CSV of a leaderboard table named by its file name (``04-Verdicts_one_decision_rule``) or by that name
    without its page number (``Verdicts_one_decision_rule``, which stays right when tables are added before it);
    None when there is no such table."""
    exact = tables / f"{table}.csv"
    if exact.is_file():
        return exact
    numbered = [p for p in sorted(tables.glob("*.csv")) if re.fullmatch(rf"\d+-{re.escape(table)}", p.stem)]
    return numbered[0] if len(numbered) == 1 else None


def block_text(doc: Path, published: Path, regenerated: Path, table: str) -> str:
    """What the block ``results:SUITE:TABLE`` of the Markdown file ``doc`` holds: the table regenerated from the
    published suite ``published`` (its leaderboard in ``regenerated``), and a link to the published leaderboard."""
    link = os.path.relpath(Path(published).resolve() / LEADERBOARD / "README.md", Path(doc).resolve().parent)
    return (markdown_table(Path(regenerated) / "tables" / f"{table}.csv")
            + f"\nFrom the published suite [{Path(published).name}]({Path(link).as_posix()}) (table {table}).\n")


def pairs_block_text(doc: Path, published: Path, table: str) -> str:
    """What the block ``results:SUITE:pairs/A,B/BY/METRIC`` holds: `quest-bench pairs`' tables of the published
    suite, and a link to its run table. ValueError says what is wrong with the name or the suite."""
    from quest_bench.pairs import report

    match = PAIRS_BLOCK.fullmatch(table)
    if not match:
        raise ValueError(f"a pairs block is named pairs/A,B/BY/METRIC (e.g. pairs/quest,qknorm/lr/"
                         f"accuracy), not {table!r}")
    a, b, by, metric = match.groups()
    if not (Path(published) / RUNS).is_file():
        raise ValueError(f"{published} has no {RUNS} (publish the suite first)")
    results = [result_of(row) for row in read_table(Path(published) / RUNS)]
    link = os.path.relpath(Path(published).resolve() / RUNS, Path(doc).resolve().parent)
    return (report(results, a, b, metric, by)
            + f"\nFrom the published suite [{Path(published).name}]({Path(link).as_posix()}) "
              f"(`quest-bench pairs --variants {a},{b} --by {by} --metric {metric}`).\n")


def result_blocks(paths: list[Path], results_root: Path, fill: bool = False) -> list[str]:
    """Every block marked ``<!-- results:SUITE:TABLE -->`` … ``<!-- /results -->`` in the Markdown files ``paths``
    compared with ``block_text`` for TABLE (a file name in tables/, without .csv, with or without its ``NN-`` page
    number: ``table_file``) regenerated from
    ``results_root/SUITE`` (or ``pairs_block_text`` for a TABLE named pairs/A,B/BY/METRIC): one line per block that
    differs or names a suite or table that is not there (none: every block is current). ``fill``: rewrite the blocks
    that differ instead (then only the missing ones are named)."""
    problems, regenerated = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in map(Path, paths):
            text = path.read_text()

            def current(match: re.Match) -> str:
                suite, table, block = match.groups()
                where = f"{path}: block results:{suite}:{table}"
                if table.startswith("pairs/"):
                    try:
                        wanted = pairs_block_text(path, Path(results_root) / suite, table)
                    except ValueError as err:
                        problems.append(f"{where}: {err}")
                        return match.group(0)
                    return keep_or_fill(match, wanted)
                if suite not in regenerated:
                    try:
                        regenerated[suite] = leaderboard_from(Path(results_root) / suite, Path(tmp) / suite)
                    except ValueError as err:
                        regenerated[suite] = err
                if isinstance(regenerated[suite], ValueError):
                    problems.append(f"{where}: {regenerated[suite]}")
                    return match.group(0)
                found = table_file(regenerated[suite] / "tables", table)
                if found is None:
                    known = ", ".join(p.stem for p in sorted((regenerated[suite] / "tables").glob("*.csv")))
                    problems.append(f"{where}: no table {table!r}; the suite's tables: {known}")
                    return match.group(0)
                return keep_or_fill(match, block_text(path, Path(results_root) / suite, regenerated[suite],
                                                      found.stem))

            def keep_or_fill(match: re.Match, wanted: str) -> str:
                suite, table, block = match.groups()
                if block != wanted and not fill:
                    problems.append(f"{path}: block results:{suite}:{table}: differs from the table regenerated from "
                                    f"{Path(results_root) / suite}; `python -m quest_bench.publish fill {path}` "
                                    "rewrites it")
                return f"<!-- results:{suite}:{table} -->\n{wanted}<!-- /results -->"

            new = BLOCK.sub(current, text)
            if fill and new != text:
                path.write_text(new)
    return problems


def doc_problems(paths: list[Path], results_root: Path) -> list[str]:
    """The result blocks of ``paths`` that are not what ``results_root`` regenerates (``result_blocks``)."""
    return result_blocks(paths, results_root)


def main(argv: list[str] | None = None) -> int:
    """``python -m quest_bench.publish check|fill FILE... [--results docs/results]``: check the result blocks of
    Markdown files against the published suites (exit 1 when any differs), or rewrite them."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m quest_bench.publish", description=main.__doc__)
    parser.add_argument("action", choices=["check", "fill"])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="published suites (default: "
                        "docs/results)")
    args = parser.parse_args(argv)
    problems = result_blocks(args.files, args.results, fill=args.action == "fill")
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
