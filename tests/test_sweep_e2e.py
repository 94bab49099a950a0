"""End-to-end sweeps on a local Ray instance: results, leaderboard, resume after a kill, worker retry."""

import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from helpers import BIN, REPO, cli_env, quest_bench, write_suite

pytestmark = pytest.mark.slow


def result_files(results, suite):
    return sorted((results / suite / "runs").glob("*/result.json"))


def test_sweep_then_leaderboard_with_a_worker_that_dies_once(tmp_path):
    suite = write_suite(tmp_path, "e2e", variants=("softmax", "quest", "qknorm"), seeds=(0, 1))
    marker = tmp_path / "crashed-once"
    results = tmp_path / "results"
    proc = quest_bench("sweep", "--suite", suite, "--results", results,
                       env=cli_env(QUEST_BENCH_FAULTS=f"crash_once={marker}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists(), "the fault was not injected: the retry path was not exercised"
    files = result_files(results, "e2e")
    assert len(files) == 6
    assert {json.loads(f.read_text())["status"] for f in files} == {"ok"}
    assert "ok 6" in proc.stdout

    board = quest_bench("leaderboard", "--suite", suite, "--results", results)
    assert board.returncode == 0, board.stderr[-3000:]
    folder = results / "e2e" / "leaderboard"
    md = (folder / "README.md").read_text()
    assert "## spurious (tiny)" in md and "Mean win rate" in md and "Δ vs softmax" in md
    for variant in ("softmax", "quest", "qknorm"):
        assert f"| {variant} | 2 |" in md
    html = (folder / "index.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<table>" in html

    again = quest_bench("sweep", "--suite", suite, "--results", results)
    assert again.returncode == 0 and "skipped 6, ok 0" in again.stdout


def test_resume_after_killing_a_sweep_runs_exactly_the_missing_runs(tmp_path):
    suite = write_suite(tmp_path, "resume", variants=("softmax", "quest"), seeds=(0, 1, 2, 3), steps=300)
    results = tmp_path / "results"
    proc = subprocess.Popen([str(BIN / "quest-bench"), "sweep", "--suite", str(suite), "--results", str(results)],
                            env=cli_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 1500  # a bound against a hung start, not a speed test (Ray starts slowly under load)
    while len(result_files(results, "resume")) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray instance it started
    proc.wait()
    subprocess.run(["pkill", "-9", "-f", str(results)], check=False)  # stray workers of that Ray instance
    done_before = len(result_files(results, "resume"))
    assert 2 <= done_before < 8, f"kill came too late to test resuming ({done_before} of 8 done)"

    rerun = quest_bench("sweep", "--suite", suite, "--results", results)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"skipped {done_before}, ok {8 - done_before}," in rerun.stdout
    run_ids = [f.parent.name for f in result_files(results, "resume")]
    assert len(run_ids) == len(set(run_ids)) == 8
    with sqlite3.connect(results / "resume" / "results.sqlite") as con:
        rows = con.execute("SELECT run_id FROM runs").fetchall()
    assert sorted(r[0] for r in rows) == sorted(run_ids)
