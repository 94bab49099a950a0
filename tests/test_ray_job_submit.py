"""The README's cluster path, `ray job submit --working-dir . -- quest-bench sweep`, against a loopback head that
uses token authentication (the token passed through the environment, as infra/README.md describes)."""

import json
import secrets
import socket
import shutil
import subprocess
import tempfile
import time

import pytest

from helpers import BIN, REPO, cli_env, write_suite
from quest_bench.sweep import startup_wait_env, startup_wait_s

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_job_submit_runs_a_sweep_on_a_loopback_cluster(tmp_path):
    # Ray's start-up waits scaled to the machine's load, as a sweep's second try scales them (30 s when idle)
    env = cli_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), **startup_wait_env(startup_wait_s(1)))
    gcs_port, dash_port = free_port(), free_port()
    # A short private temp dir (Ray's socket paths must stay under 107 bytes) that names this cluster's processes,
    # so the test stops only them: `ray stop` would kill every Ray instance on the machine.
    ray_dir = tempfile.mkdtemp(prefix="qb-ray-", dir="/tmp")
    start = subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--temp-dir={ray_dir}", "--node-ip-address=127.0.0.1",
         f"--port={gcs_port}", "--num-cpus=2",
         # explicit free ports: another Ray instance on this machine (e.g. a local sweep) holds the default ones
         *(f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                  "runtime-env-agent-port", "metrics-export-port",
                                                  "ray-client-server-port")),
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
         "--disable-usage-stats"],
        capture_output=True, text=True, env=env, timeout=900,  # a bound against a hang: a loaded machine is slow
    )
    assert start.returncode == 0, start.stderr[-3000:]
    try:
        suite = write_suite(tmp_path, "jobsubmit", variants=("softmax", "quest"), seeds=(0,))
        results = tmp_path / "results"  # absolute: the job runs in a copy of the working dir
        submit = [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dash_port}",
                  "--working-dir", ".", "--runtime-env", "infra/runtime_env.yaml", "--",
                  "quest-bench", "sweep", "--suite", str(suite), "--results", str(results)]
        deadline = time.time() + 600  # a bound, not a speed test
        while True:  # the job agent can come up some time after `ray start` returns (Ray answers 500)
            job = subprocess.run(submit, capture_output=True, text=True, env=env, timeout=1200, cwd=REPO)
            if "No available agent to submit job" not in job.stderr + job.stdout or time.time() > deadline:
                break
            time.sleep(3)
        assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]
        no_token = subprocess.run(submit[:2] + ["list", *submit[3:5]], capture_output=True, text=True,
                                  env=cli_env(), timeout=600, cwd=REPO)
        assert no_token.returncode != 0 and "Missing authentication token" in no_token.stderr  # Jobs API refuses
        assert "succeeded" in (job.stdout + job.stderr)
        files = sorted((results / "jobsubmit" / "runs").glob("*/result.json"))
        assert [json.loads(f.read_text())["status"] for f in files] == ["ok", "ok"]
    finally:
        subprocess.run(["pkill", "-9", "-f", ray_dir], check=False)  # GCS, raylet, dashboard, agents of this head
        shutil.rmtree(ray_dir, ignore_errors=True)
