"""The README's cluster path, `ray job submit --working-dir . -- quest-bench sweep`, against a loopback head."""

import json
import socket
import subprocess

import pytest

from helpers import BIN, REPO, cli_env, write_suite

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_job_submit_runs_a_sweep_on_a_loopback_cluster(tmp_path):
    env = cli_env()
    gcs_port, dash_port = free_port(), free_port()
    start = subprocess.run(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs_port}", "--num-cpus=2",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
         "--disable-usage-stats"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert start.returncode == 0, start.stderr[-3000:]
    try:
        suite = write_suite(tmp_path, "jobsubmit", variants=("softmax", "quest"), seeds=(0,))
        results = tmp_path / "results"  # absolute: the job runs in a copy of the working dir
        job = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dash_port}", "--working-dir", ".",
             "--runtime-env", "infra/runtime_env.yaml", "--",
             "quest-bench", "sweep", "--suite", str(suite), "--results", str(results)],
            capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
        )
        assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]
        assert "succeeded" in (job.stdout + job.stderr)
        files = sorted((results / "jobsubmit" / "runs").glob("*/result.json"))
        assert [json.loads(f.read_text())["status"] for f in files] == ["ok", "ok"]
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, env=env, timeout=120)
