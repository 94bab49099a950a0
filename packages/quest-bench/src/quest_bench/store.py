"""Results store: one folder per run (the source of truth) plus an SQLite index the leaderboard queries.

    <results>/<suite>/runs/<run_id>/spec.json      the RunSpec
                                   /result.json    the RunResult (written last, atomically: its presence = finished)
                                   /events.jsonl   training curves and telemetry
    <results>/<suite>/results.sqlite               table `runs`, one row per run: an index, rebuilt from the folders
                                                   whenever a folder is newer than it or it cannot be read
    <results>/<suite>/.lock                        held by the one sweep driver writing here

Only the driver writes here. A corrupt or unreadable run folder is reported and skipped, never fatal. A result that
cannot be used (status ok without a finite primary metric, e.g. an edited or truncated result.json) is reported
and counts as not finished, so the next sweep runs it again. A read-only results folder is read without an index.
"""

from __future__ import annotations

import fcntl
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
    status TEXT, primary_metric TEXT, primary_value REAL, wall_s REAL, result TEXT
)
"""


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
        self._readable: int | None = None  # readable run folders, counted at the last rebuild or load
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
        tmp.write_text(result.to_json())
        os.replace(tmp, folder / "result.json")
        self._readable = None
        try:
            with self._connect() as con:
                self._upsert(con, result)
        except sqlite3.Error as err:  # the folder is written; the index is rebuilt from it on the next read
            print(f"results index {self.db_path} not updated ({err}); it will be rebuilt", file=sys.stderr)

    @staticmethod
    def _upsert(con: sqlite3.Connection, r: RunResult) -> None:
        value = r.metrics.get(r.primary_metric)
        con.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.run_id, r.task, r.variant, r.preset, r.seed, json.dumps(r.overrides, sort_keys=True), r.status,
             r.primary_metric, value if isinstance(value, (int, float)) else None, r.cost.get("wall_s"), r.to_json()),
        )

    def read_folder(self, folder: Path) -> RunResult:
        result = RunResult.from_dict(json.loads((folder / "result.json").read_text()))
        if result.run_id != folder.name:
            raise ValueError(f"result.json says run_id {result.run_id!r} but the folder is {folder.name!r}")
        return result

    def result_files(self) -> list[Path]:
        return sorted(self.runs_dir.glob("*/result.json")) if self.runs_dir.is_dir() else []

    def scan(self, warn: bool = True) -> tuple[list[RunResult], list[str]]:
        """Every readable result in the run folders, and a message per corrupt one."""
        results, problems = [], []
        for path in self.result_files():
            try:
                results.append(self.read_folder(path.parent))
            except (OSError, ValueError, TypeError) as err:
                problems.append(f"skipping corrupt run folder {path.parent}: {err}")
        if warn:
            for p in problems:
                print(p, file=sys.stderr)
        return results, problems

    def finished_ids(self) -> set[str]:
        """The run_ids whose results count as finished (read from the folders; writes nothing)."""
        results, _ = self.scan(warn=False)
        return {r.run_id for r in results if is_finished(r)}

    def rebuild(self) -> list[str]:
        """Recreate the index from the run folders (built aside and moved into place, so that a reader never sees
        a half-built index); returns the problems found."""
        results, problems = self.scan()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.db_path.with_name(f"{self.db_path.name}.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        con = sqlite3.connect(tmp)
        try:
            con.execute(SCHEMA)
            for r in results:
                self._upsert(con, r)
            con.commit()
        finally:
            con.close()
        os.replace(tmp, self.db_path)
        self._readable = len(results)
        return problems

    def _readable_count(self) -> int:
        """How many run folders hold a readable result (corrupt ones are not in the index)."""
        if self._readable is None:
            self._readable = len(self.scan(warn=False)[0])
        return self._readable

    def _index_is_stale(self) -> bool:
        if not self.db_path.exists():
            return True
        built = self.db_path.stat().st_mtime
        return any(path.stat().st_mtime > built for path in self.result_files())

    def load(self) -> list[RunResult]:
        """All results. From the index when it is current; rebuilt first when a run folder is newer than it, when
        its row count differs from the folders, or on any database error; read straight from the folders (an
        index in memory) when the results folder cannot be written."""
        try:
            if self._index_is_stale():
                self.rebuild()
            with self._connect() as con:
                rows = con.execute("SELECT result FROM runs").fetchall()
            if len(rows) != self._readable_count():
                self.rebuild()
                with self._connect() as con:
                    rows = con.execute("SELECT result FROM runs").fetchall()
            return [RunResult.from_dict(json.loads(row[0])) for row in rows]
        except (sqlite3.Error, ValueError, TypeError):  # a corrupt index: rebuild it from the folders
            try:
                self.rebuild()
                with self._connect() as con:
                    return [RunResult.from_dict(json.loads(row[0]))
                            for row in con.execute("SELECT result FROM runs").fetchall()]
            except (sqlite3.Error, OSError):
                return self.scan()[0]
        except OSError:  # read-only results folder: nothing is written, the folders are the index
            return self.scan()[0]

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
    the same runs twice. The file names its holder; a second driver refuses (or, with ``wait``, waits)."""

    def __init__(self, path: Path, wait: bool = False):
        self.path, self.wait, self.fd = Path(path), wait, None

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
                    raise ValueError(in_use_message(self.path.parent, holder)) from None
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
