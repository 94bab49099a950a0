"""End-to-end faults of a sweep on a local Ray instance: authentication and loopback binding, a Python error and a
hang in a worker (traceback kept, timeout enforced), one fresh process per run, run folders written live."""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import cli_env, quest_bench, write_suite

pytestmark = pytest.mark.slow

SWEEP_INSTANCE = r"""
import os, sys
from quest_bench.sweep import ray_session
with ray_session(None, 0) as ray:
    print(ray.get_runtime_context().gcs_address, os.environ["RAY_AUTH_TOKEN"], flush=True)
    sys.stdin.readline()
"""

CLIENT = r"""
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("RESULT", ray.get(ray.remote(lambda: 42).remote(), timeout=300), flush=True)
"""


def client(address: str, **env) -> tuple[bool, str]:
    """Whether a fresh process with ``env`` can join ``address`` and run a task, and what it printed."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base["RAY_NUM_REDIS_GET_RETRIES"] = "2"  # fail in seconds, not Ray's default 20 attempts
    base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # reach the instance on 127.0.0.1 (else Ray uses the network
    # address, where nothing answers), so that a refusal below is the token's doing
    proc = subprocess.run([sys.executable, "-c", CLIENT, address], env={**base, **env}, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode == 0 and "RESULT 42" in proc.stdout, proc.stdout + proc.stderr


def external_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_a_sweeps_ray_instance_is_loopback_only_and_refuses_clients_without_its_token(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    driver = subprocess.Popen([sys.executable, "-c", SWEEP_INSTANCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**env, "HOME": str(home)})
    try:
        address, token = driver.stdout.readline().split()
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        ip = external_ip()
        if ip:  # the GCS port does not answer on the machine's network address
            with pytest.raises(OSError), socket.create_connection((ip, int(port)), timeout=5):
                pass
        for env_of_client in ({"RAY_AUTH_MODE": "disabled"},
                              {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}):
            worked, output = client(address, **env_of_client)
            assert not worked and "InvalidAuthToken" in output  # refused by the instance, for the token
        assert client(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)[0]  # the check itself works
        assert list(home.iterdir()) == []  # no ~/.ray/auth_token
    finally:
        driver.communicate("\n", timeout=600)
    assert driver.returncode == 0


def test_errors_hangs_and_fresh_workers(tmp_path):
    suite = write_suite(tmp_path, "faults", variants=("softmax",), seeds=(0, 1, 2, 3))
    results = tmp_path / "results"
    scratch_tmp = Path(tempfile.mkdtemp(prefix="qbt-", dir="/tmp"))  # short: Ray's socket paths live under it
    # the timeout counts from a run's start on its worker and is far above what a 40-step run takes on a loaded
    # machine; the hung run sleeps an hour, so the sweep ending within the bound below means it was cancelled
    proc = quest_bench("sweep", "--suite", suite, "--results", results, "--run-timeout", "150", timeout=2400,
                       env=cli_env(TMPDIR=str(scratch_tmp), QUEST_BENCH_FAULTS="raise_for_seed=1,hang_for_seed=2"))
    assert proc.returncode == 1, proc.stderr[-3000:]  # two runs failed
    runs = {json.loads(p.read_text())["seed"]: p.parent for p in (results / "faults" / "runs").glob("*/result.json")}
    result = {seed: json.loads((folder / "result.json").read_text()) for seed, folder in runs.items()}
    assert [result[s]["status"] for s in range(4)] == ["ok", "failed", "failed", "ok"]
    assert result[1]["reason"] == "RuntimeError: injected fault outside the run (seed 1)"
    error = (runs[1] / "error.txt").read_text()
    assert 'File "' in error and "injected fault outside the run" in error  # the worker's traceback
    assert result[2]["reason"].startswith("timeout: still running after 150 s")
    assert result[0]["env"]["pid"] != result[3]["env"]["pid"]  # max_calls=1: a fresh worker process per run
    lines = [line for line in proc.stderr.splitlines() if "spurious/softmax/tiny/seed2" in line]
    assert len(lines) == 1 and lines[0].startswith("failed") and "timeout" in lines[0]  # one line per finished run
    assert not list(scratch_tmp.glob("quest-bench-sweep-*"))  # no scratch: runs write into the results folder
    board = quest_bench("leaderboard", "--suite", suite, "--results", results)
    assert board.returncode == 0
    assert board.stderr.count("warning: run ") == 2
    subprocess.run(["rm", "-rf", str(scratch_tmp)], check=False)


def test_infeasible_resources_are_refused_up_front(tmp_path):
    suite = tmp_path / "gpu.yaml"
    suite.write_text("name: gpu\ntasks: [image-cls]\nvariants: [quest]\npresets: [paper]\n")
    for split in ("train", "val"):  # the layout its data check needs (checked before Ray starts)
        (tmp_path / "data" / split / "n01440764").mkdir(parents=True)
    proc = quest_bench("sweep", "--suite", suite, "--results", tmp_path / "results", "--data-root", tmp_path / "data")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("quest-bench: error: run image-cls/quest/paper/seed0 needs 8 worker(s) of 10 CPUs, 1 GPUs")
    assert "(cuda), but the cluster's nodes have: " in last
    assert not (tmp_path / "results").exists()  # nothing written


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "kill"])
def test_a_run_s_curves_are_live_in_the_results_folder_and_ctrl_c_or_kill_stops_in_one_line(tmp_path, stop, code):
    # runs long enough (~3 min each) to be still training when the signal comes, however fast the machine
    suite = write_suite(tmp_path, "sigint", variants=("softmax",), seeds=(0, 1), steps=40000)
    results = tmp_path / "results"
    scratch_tmp = Path(tempfile.mkdtemp(prefix="qbt-", dir="/tmp"))
    # Ctrl-C reaches a foreground command whose SIGINT is at its default; when this test suite itself runs as a
    # background job (`make test &`), the shell has set SIGINT to ignored, and the child would inherit that.
    proc = subprocess.Popen([str(Path(sys.executable).parent / "quest-bench"), "sweep", "--suite", str(suite),
                             "--results", str(results)], env=cli_env(TMPDIR=str(scratch_tmp)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # wait for the event (a run has logged its first rows, while it trains) or for the sweep to end; the bound is
    # for a hung sweep only, far above what a loaded machine needs to start Ray and a run
    deadline = time.time() + 1500
    events = lambda: [p for p in results.glob("sigint/runs/*/events.jsonl") if p.stat().st_size]  # noqa: E731
    while not events() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert events(), "no training curve appeared in the results folder while the run trained"
    assert json.loads(events()[0].read_text().splitlines()[0])["step"] >= 1
    assert list(results.glob("sigint/runs/*/tensorboard/events.out.tfevents.*"))
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=600)  # a bound for a hung stop: a loaded machine stops Ray slowly
    assert proc.returncode == code, err[-2000:]
    assert "interrupted" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not list(results.glob("sigint/runs/*/result.json"))
    subprocess.run(["rm", "-rf", str(scratch_tmp)], check=False)
