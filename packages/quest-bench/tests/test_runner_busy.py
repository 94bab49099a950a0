"""A local Ray instance on a busy machine: start-up waits scaled with the load, free ports, one retry, one line and
exit 1 when Ray cannot start, Ctrl-C/SIGTERM during start-up; two sweeps at once while busy processes load the
cores."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import cli_env, write_suite
from quest_bench import cli, sweep


def test_startup_waits_scale_with_the_load_per_core_and_double_on_the_retry(monkeypatch):
    cores = os.cpu_count()
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert sweep.startup_wait_s() == sweep.STARTUP_WAIT_S  # an idle machine keeps Ray's own waits
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 0.0, 0.0))
    assert sweep.startup_wait_s() == 4 * sweep.STARTUP_WAIT_S
    assert sweep.startup_wait_s(1) == 8 * sweep.STARTUP_WAIT_S
    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0 * cores, 0.0, 0.0))
    assert sweep.startup_wait_s() == sweep.STARTUP_WAIT_MAX_S


def test_startup_settings_free_the_agent_port_scale_ray_s_waits_and_are_undone(monkeypatch):
    import ray._private.parameter as parameter
    import ray._private.services as services

    monkeypatch.delenv("RAY_agent_register_timeout_ms", raising=False)
    monkeypatch.delenv(sweep.WORKER_NICENESS, raising=False)
    before, get_node = parameter.RayParams, services.get_node
    assert before().dashboard_agent_listen_port == 52365  # Ray's fixed default, which two instances cannot share
    with sweep.startup_settings(123.0):
        params = parameter.RayParams(metrics_export_port=None)  # as ray.init passes it
        ports = [getattr(params, key) for key in sweep.AGENT_PORTS]
        assert len(set(ports)) == 4 and 52365 not in ports and all(p > 0 for p in ports)  # free, distinct
        assert parameter.RayParams(dashboard_agent_listen_port=4242).dashboard_agent_listen_port == 4242
        assert os.environ["RAY_agent_register_timeout_ms"] == "123000"
        assert os.environ["RAY_gcs_server_port_wait_time_s"] == "123"
        assert os.environ[sweep.WORKER_NICENESS] == "0"  # the runs at the sweep's priority, not Ray's 15
        assert services.get_node is not get_node  # waits for the raylet up to the scaled time
    assert parameter.RayParams is before and services.get_node is get_node
    assert "RAY_agent_register_timeout_ms" not in os.environ and sweep.WORKER_NICENESS not in os.environ
    monkeypatch.setenv(sweep.WORKER_NICENESS, "5")
    with sweep.startup_settings(1.0):
        assert os.environ[sweep.WORKER_NICENESS] == "5"  # the caller's own choice is kept


class FakeRay:
    """``ray.init`` that fails ``failures`` times, then starts."""

    def __init__(self, failures: int):
        self.failures, self.inits, self.shutdowns, self.kwargs = failures, 0, 0, []

    def init(self, **kwargs):
        self.inits += 1
        self.kwargs.append(kwargs)
        if self.inits <= self.failures:
            raise Exception("The current node timed out during startup.\nmore lines of Ray's")

    def shutdown(self):
        self.shutdowns += 1


def test_a_failed_start_is_cleaned_up_and_tried_once_more(capsys):
    ray = FakeRay(failures=1)
    sweep.start_local_ray(ray, num_cpus=1)
    assert ray.inits == 2 and ray.shutdowns == 1
    assert ray.kwargs[0]["dashboard_port"] > 0 and ray.kwargs[0]["num_cpus"] == 1  # a free port, not 8265
    assert "trying once more" in capsys.readouterr().err


def test_ray_that_cannot_start_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    ray = FakeRay(failures=2)
    with pytest.raises(sweep.RayStartError, match="2 tries.*The current node timed out during startup. Try again"):
        sweep.start_local_ray(ray)
    assert ray.inits == 2 and ray.shutdowns == 2
    import ray as real_ray

    monkeypatch.setattr(real_ray, "init", FakeRay(failures=9).init)
    monkeypatch.setattr(real_ray, "shutdown", lambda: None)
    suite = write_suite(tmp_path, "nostart", variants=("softmax",), seeds=(0,))
    capsys.readouterr()
    code = cli.main(["sweep", "--suite", str(suite), "--results", str(tmp_path / "results"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("quest-bench: error: could not start a local Ray instance (2 tries")
    assert "Traceback" not in "\n".join(err)
    assert not list((tmp_path / "results").glob("nostart/runs/*"))


def busy_processes(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def sweep_process(suite, results: Path, scratch: Path) -> subprocess.Popen:
    """``quest-bench sweep`` of a suite file, or of the command-line options in a list."""
    shape = ["--suite", str(suite)] if isinstance(suite, Path) else suite
    return subprocess.Popen([str(Path(sys.executable).parent / "quest-bench"), "sweep", *shape,
                             "--results", str(results), "--quiet"], env=cli_env(TMPDIR=str(scratch)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
def test_two_sweeps_started_together_on_loaded_cores_both_finish(tmp_path):
    scratch = Path(tempfile.mkdtemp(prefix="qbt-", dir="/tmp"))  # short: Ray's socket paths live under it
    busy = busy_processes(2 * (os.cpu_count() or 1))
    try:
        on_the_command_line = ["--task", "spurious", "--variants", "softmax", "--seeds", "0-1", "--name", "busy1",
                               "--set", "steps=40", "--set", "warmup_steps=4", "--set", "eval_samples=300", "--set", "log_every=10"]
        procs = [sweep_process(write_suite(tmp_path, "busy0", variants=("softmax",), seeds=(0, 1)),
                               tmp_path / "results", scratch),
                 sweep_process(on_the_command_line, tmp_path / "results", scratch)]
        outputs = [p.communicate(timeout=1800) for p in procs]  # a bound for a hung start, not a speed test
    finally:
        for p in busy:
            p.kill()
            p.wait()
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    for i in range(2):
        results = [json.loads(p.read_text()) for p in (tmp_path / "results").glob(f"busy{i}/runs/*/result.json")]
        assert sorted(r["status"] for r in results) == ["ok", "ok"]
    assert (tmp_path / "results" / "busy1" / "suite.yaml").is_file()  # the command-line suite, recorded


@pytest.mark.slow
@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "kill"])
def test_ctrl_c_or_kill_during_ray_start_up_stops_in_one_line(tmp_path, stop, code):
    scratch = Path(tempfile.mkdtemp(prefix="qbt-", dir="/tmp"))
    proc = sweep_process(write_suite(tmp_path, "early", variants=("softmax",), seeds=(0,)), tmp_path / "results",
                         scratch)
    try:
        line = proc.stderr.readline()  # printed just before ray.init
        assert line.startswith("starting a local Ray instance"), line
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=300)  # generous: a loaded machine stops Ray's processes slowly
    finally:
        proc.kill()
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    assert proc.returncode == code, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("quest-bench: interrupted") and "Traceback" not in err
    assert not list((tmp_path / "results").glob("early/runs/*/result.json"))
