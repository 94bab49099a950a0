"""Results store: one folder per run (the source of truth) plus an SQLite database the leaderboard queries.

    <results>/<suite>/runs/<run_id>/spec.json      the RunSpec
                                   /result.json    the RunResult (written last, atomically: its presence = finished)
                                   /events.jsonl   training curves and telemetry
    <results>/<suite>/results.sqlite               table `runs`, one row per run; rebuilt from the folders on demand

Only the driver writes here. A corrupt or unreadable run folder is reported and skipped, never fatal.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

from quest_bench.result import RunResult
from quest_bench.spec import RunSpec

FINISHED = ("ok", "diverged")  # failed runs are retried when the sweep is run again

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, task TEXT, variant TEXT, preset TEXT, seed INTEGER, overrides TEXT,
    status TEXT, primary_metric TEXT, primary_value REAL, wall_s REAL, result TEXT
)
"""


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.db_path = self.root / "results.sqlite"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def _connect(self) -> sqlite3.Connection:
        self.root.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.db_path)
        con.execute(SCHEMA)
        return con

    def write(self, spec: RunSpec, result: RunResult) -> None:
        """Write spec.json and result.json (atomically) and upsert the database row."""
        folder = self.run_dir(spec.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True))
        tmp = folder / "result.json.tmp"
        tmp.write_text(result.to_json())
        os.replace(tmp, folder / "result.json")
        with self._connect() as con:
            self._upsert(con, result)

    @staticmethod
    def _upsert(con: sqlite3.Connection, r: RunResult) -> None:
        con.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.run_id, r.task, r.variant, r.preset, r.seed, json.dumps(r.overrides, sort_keys=True), r.status,
             r.primary_metric, r.metrics.get(r.primary_metric), r.cost.get("wall_s"), r.to_json()),
        )

    def read_folder(self, folder: Path) -> RunResult:
        result = RunResult.from_dict(json.loads((folder / "result.json").read_text()))
        if result.run_id != folder.name:
            raise ValueError(f"result.json says run_id {result.run_id!r} but the folder is {folder.name!r}")
        return result

    def scan(self, warn=True) -> tuple[list[RunResult], list[str]]:
        """Every readable result in the run folders, and a message per corrupt one."""
        results, problems = [], []
        for folder in sorted(self.runs_dir.glob("*")) if self.runs_dir.exists() else []:
            if not (folder / "result.json").exists():
                continue  # unfinished run
            try:
                results.append(self.read_folder(folder))
            except (OSError, ValueError, TypeError) as err:
                problems.append(f"skipping corrupt run folder {folder}: {err}")
        if warn:
            for p in problems:
                print(p, file=sys.stderr)
        return results, problems

    def sync(self) -> set[str]:
        """Rebuild the database from the run folders and return the finished run_ids.

        A driver killed between writing result.json and its database row leaves the two out of step; the sweep
        calls this first, so the folders (the source of truth) always win.
        """
        self.rebuild()
        results, _ = self.scan(warn=False)
        return {r.run_id for r in results if r.status in FINISHED}

    def rebuild(self) -> list[str]:
        """Recreate the database from the run folders; returns the problems found."""
        results, problems = self.scan()
        if self.db_path.exists():
            self.db_path.unlink()
        with self._connect() as con:
            for r in results:
                self._upsert(con, r)
        return problems

    def load(self) -> list[RunResult]:
        """All results, from the database (rebuilt first if it is missing or behind the folders)."""
        on_disk = len(list(self.runs_dir.glob("*/result.json"))) if self.runs_dir.exists() else 0
        with self._connect() as con:
            rows = con.execute("SELECT result FROM runs").fetchall()
        if len(rows) != on_disk:
            self.rebuild()
            with self._connect() as con:
                rows = con.execute("SELECT result FROM runs").fetchall()
        return [RunResult.from_dict(json.loads(row[0])) for row in rows]
