"""Results store: one folder per run (the source of truth) plus an SQLite index the leaderboard queries.

    <results>/<suite>/runs/<run_id>/spec.json      the RunSpec
                                   /result.json    the RunResult (written last, atomically: its presence = finished)
                                   /events.jsonl   training curves and telemetry
    <results>/<suite>/results.sqlite               table `runs`, one row per run: a cache of the folders for queries,
                                                   rebuilt whenever any row differs from its folder's result.json
                                                   (compared by content: its sha256, not timestamps)
    <results>/<suite>/.lock                        held by the one sweep driver writing here

Only the driver writes here. The folders are the truth: every result.json is checked against the result schema
(``quest_bench.result.check_record``) when read; one that is unreadable or invalid is reported in one line naming
its file and skipped, never fatal. A result that cannot be used (status ok without a finite primary metric, e.g. an
edited or truncated result.json) is reported and counts as not finished, so the next sweep runs it again. A
read-only results folder is read without an index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import socket
import sqlite3
import sys
import time
from pathlib import Path

from quest_bench.result import RunResult
from quest_bench.spec import RunSpec

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, task TEXT, variant TEXT, preset TEXT, seed INTEGER, overrides TEXT,
    status TEXT, primary_metric TEXT, primary_value REAL, wall_s REAL, result TEXT, sha256 TEXT
)
"""


def finite_or_none(value):
    """A number for an index column (SQLite stores NaN as NULL: so does this, and rows compare equal)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def index_row(result: RunResult, text: str) -> tuple:
    """The index row of a result read from ``text`` (its result.json), with that text's sha256."""
    return (result.run_id, result.task, result.variant, result.preset, result.seed,
            json.dumps(result.overrides, sort_keys=True), result.status, result.primary_metric,
            finite_or_none(result.metrics.get(result.primary_metric)), finite_or_none(result.cost.get("wall_s")), text,
            hashlib.sha256(text.encode()).hexdigest())


def unusable_reason(result: RunResult) -> str | None:
    """Why a stored result cannot count as finished (None if it can): ok and diverged runs are results; an ok run
    needs a finite primary metric."""
    if result.status == "diverged":
        return None
    if result.status != "ok":
        return f"status {result.status}" + (f" ({result.reason})" if result.reason else "")
    value = result.metrics.get(result.primary_metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return f"status ok but primary metric {result.primary_metric!r} is {value!r}"
    return None


def is_finished(result: RunResult) -> bool:
    return unusable_reason(result) is None


def spec_record(spec: RunSpec, result: RunResult | None = None) -> dict:
    """What spec.json holds: the spec (its run_id) and, once the run has an environment, what `quest-bench run
    --spec` needs to repeat it exactly and the run_id does not cover: the data root and the torch thread count."""
    record = spec.to_json()
    if result is not None:
        record["data_root"] = result.env.get("data_root")
        record["torch_threads"] = result.env.get("torch_threads")
    return record


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.db_path = self.root / "results.sqlite"
        self.lock_path = self.root / ".lock"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def _connect(self) -> sqlite3.Connection:
        self.root.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.db_path)
        con.execute(SCHEMA)
        return con

    def write(self, spec: RunSpec, result: RunResult) -> None:
        """Write spec.json and result.json (atomically) and upsert the index row."""
        folder = self.run_dir(spec.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(spec_record(spec, result), indent=2, sort_keys=True))
        tmp = folder / "result.json.tmp"
        text = result.to_json()
        tmp.write_text(text)
        os.replace(tmp, folder / "result.json")
        try:
            with self._connect() as con:
                self._upsert(con, index_row(result, text))
        except sqlite3.Error:  # e.g. an index of an older layout: rebuilt from the folders now
            try:
                self._write_index(self._scan(warn=False)[1])
            except (sqlite3.Error, OSError) as err:  # the folder is written; the next read rebuilds the index
                print(f"results index {self.db_path} not updated ({err}); it will be rebuilt", file=sys.stderr)

    @staticmethod
    def _upsert(con: sqlite3.Connection, row: tuple) -> None:
        con.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def read_folder(self, folder: Path) -> RunResult:
        return self._read(folder)[0]

    @staticmethod
    def _read(folder: Path) -> tuple[RunResult, tuple]:
        """A run folder's result, checked against the schema, and its index row."""
        text = (folder / "result.json").read_bytes().decode("utf-8")
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError("nested too deeply to be a result") from None
        result = RunResult.from_dict(data)
        if result.run_id != folder.name:
            raise ValueError(f"result.json says run_id {result.run_id!r} but the folder is {folder.name!r}")
        return result, index_row(result, text)

    def result_files(self) -> list[Path]:
        return sorted(self.runs_dir.glob("*/result.json")) if self.runs_dir.is_dir() else []

    def scan(self, warn: bool = True) -> tuple[list[RunResult], list[str]]:
        """Every valid result in the run folders, and a message per corrupt one."""
        results, _, problems = self._scan(warn)
        return results, problems

    def _scan(self, warn: bool = True) -> tuple[list[RunResult], list[tuple], list[str]]:
        results, rows, problems = [], [], []
        for path in self.result_files():
            try:
                result, row = self._read(path.parent)
            except (OSError, ValueError, TypeError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                message = str(getattr(err, "strerror", None) or err)
                problems.append(f"skipping corrupt run folder {path.parent} ({path.name}: "
                                f"{message[:300].replace(chr(10), ' ')})")
                continue
            results.append(result)
            rows.append(row)
        if warn:
            for p in problems:
                print(p, file=sys.stderr)
        return results, rows, problems

    def finished_ids(self) -> set[str]:
        """The run_ids whose results count as finished (read from the folders; writes nothing)."""
        results, _ = self.scan(warn=False)
        return {r.run_id for r in results if is_finished(r)}

    def rebuild(self) -> list[str]:
        """Recreate the index from the run folders; returns the problems found."""
        _, rows, problems = self._scan()
        self._write_index(rows)
        return problems

    def _write_index(self, rows: list[tuple]) -> None:
        """The index holding exactly ``rows``, built aside and moved into place (a reader never sees it half
        built). The old file's rollback journal goes first: left by a process killed inside a transaction, it
        would be rolled back onto the new file by the next connection, dropping rows."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.db_path.with_name(f"{self.db_path.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        con = sqlite3.connect(tmp)
        try:
            con.execute(SCHEMA)
            for row in rows:
                self._upsert(con, row)
            con.commit()
        finally:
            con.close()
        for suffix in ("-journal", "-wal", "-shm"):
            self.db_path.with_name(self.db_path.name + suffix).unlink(missing_ok=True)
        os.replace(tmp, self.db_path)

    def _index_rows(self) -> set[tuple] | None:
        """The index's rows, or None when there is none or it cannot be read (creates nothing)."""
        if not self.db_path.is_file():
            return None
        try:
            con = sqlite3.connect(f"{self.db_path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                return set(con.execute("SELECT run_id, task, variant, preset, seed, overrides, status, primary_metric,"
                                       " primary_value, wall_s, result, sha256 FROM runs"))
            finally:
                con.close()
        except (sqlite3.Error, OSError):
            return None

    def load(self, warn: bool = True) -> list[RunResult]:
        """All valid results, read from the run folders (the truth; invalid ones reported and skipped). The index
        is brought in line when any of its rows differs from its folder (content, status, a missing or extra row,
        a database that cannot be read); a results folder that cannot be written is only read. ``warn``: print a
        line per corrupt folder."""
        results, rows, _ = self._scan(warn)
        if self._index_rows() != set(rows):
            try:
                self._write_index(rows)
            except (sqlite3.Error, OSError):  # read-only results folder: the folders are the index
                pass
        return results

    def lock(self, wait: bool = False) -> "StoreLock":
        return StoreLock(self.lock_path, wait)

    def lock_holder(self) -> str | None:
        """Who holds this folder's lock now (None if nobody); creates nothing."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:
            return None  # no lock file (or unreadable): nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            return self.lock_path.read_text().strip() or "another process"
        finally:
            os.close(fd)


def in_use_message(folder: Path, holder: str) -> str:
    return (f"results folder {folder} is in use by another sweep driver ({holder}); wait for it to finish, or pass "
            "--wait to queue behind it")


class StoreLock:
    """An exclusive lock on a results folder (``fcntl.flock`` on ``.lock``), so that two sweep drivers never run
    the same runs twice (and two `run --out` never write one run folder). The file names its holder; a second
    driver refuses (or, with ``wait``, waits). ``busy``: the refusal's message, with ``{holder}`` in it."""

    def __init__(self, path: Path, wait: bool = False, busy: str | None = None):
        self.path, self.wait, self.fd, self.busy = Path(path), wait, None, busy

    def __enter__(self) -> "StoreLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        announced = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = self.path.read_text().strip() or "another process"
                if not self.wait:
                    os.close(self.fd)
                    raise ValueError(self.busy.format(holder=holder) if self.busy
                                     else in_use_message(self.path.parent, holder)) from None
                if not announced:
                    print(f"waiting for the sweep driver holding {self.path} ({holder})", file=sys.stderr)
                    announced = True
                time.sleep(2)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n".encode())
        return self

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
