"""No silent waits, and Ray kept on loopback: ``--wait-for-resources`` says what each run waits for and gives up after
its timeout; a local Ray instance opens no metrics endpoint and listens on 127.0.0.1 only; joining a loopback
``--address`` keeps the driver on loopback too."""

import json
import os

import psutil  # also used by the subprocess code below, which lists the listening ports
import pytest

import quest_bench.sweep as sweep
from quest_bench.spec import RunSpec
from quest_sdk.task import Resources, Task, TaskOutput


@pytest.mark.parametrize("address, loopback", [("127.0.0.1:6379", True), ("localhost:6379", True),
                                               ("ray://127.0.0.1:10001", True), ("[::1]:6379", True),
                                               ("127.0.1.1:6379", True), ("10.0.0.5:6379", False),
                                               ("head.cluster:6379", False), ("auto", False)])
def test_loopback_addresses_are_recognised(address, loopback):
    assert sweep.is_loopback(address) is loopback


def test_joining_a_loopback_address_keeps_the_driver_on_loopback(monkeypatch):
    from ray._private import ray_constants

    seen = {}

    def fake_init(ray, **kwargs):
        seen.update(address=kwargs["address"], mode=os.environ.get(sweep.SINGLE_MACHINE),
                    cluster=ray_constants.ENABLE_RAY_CLUSTER)

    monkeypatch.setattr(sweep, "init_keeping_sigterm", fake_init)
    monkeypatch.delenv(sweep.SINGLE_MACHINE, raising=False)
    before = ray_constants.ENABLE_RAY_CLUSTER
    with sweep.ray_session("127.0.0.1:6379", 0):
        pass
    assert seen == {"address": "127.0.0.1:6379", "mode": "0", "cluster": False}
    assert sweep.SINGLE_MACHINE not in os.environ and ray_constants.ENABLE_RAY_CLUSTER == before  # restored
    with sweep.ray_session("10.0.0.5:6379", 0):
        pass
    assert seen["mode"] is None and seen["cluster"] == before  # a real cluster address is left alone


class GpuTask(Task):
    name, version, primary_metric = "gpu-only", "1", "score"
    presets = {"tiny": {}}
    resources = {"tiny": Resources(num_cpus=1, num_gpus=1)}

    def make_config(self, preset, overrides=None):
        return object()

    def run(self, config, ctx):
        return TaskOutput(metrics={"score": 1.0})


@pytest.mark.slow
def test_wait_for_resources_says_what_it_waits_for_and_gives_up_after_the_timeout(tmp_path, monkeypatch, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the run would be placeable")
    monkeypatch.setattr(sweep, "get_task", lambda name: GpuTask())
    monkeypatch.setattr(sweep, "POLL_S", 0.5)
    spec = RunSpec("gpu-only", "quest", "tiny", 0, {}, "x")
    suite = type("S", (), {"name": "waits", "specs": [spec], "tune": (), "confirm": ()})()
    counts = sweep.run_sweep(suite, tmp_path, wait_for_resources=True, run_timeout=3, progress=False)
    assert counts["failed"] == 1
    err = capsys.readouterr().err
    assert "waiting for resources: run gpu-only/quest/tiny/seed0 needs 1 worker(s) of 1 CPUs, 1 GPUs" in err
    assert "giving up after 3 s (--run-timeout)" in err
    result = json.loads((tmp_path / "waits" / "runs" / spec.run_id / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["reason"].startswith("timeout: waited 3 s for resources no node has (--run-timeout): run ")


PROBE = """
import json, psutil
from quest_bench.sweep import ray_session
with ray_session(None, 0) as ray:
    node = ray.nodes()[0]
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
    print(json.dumps({"node": node["NodeManagerAddress"], "export_port": node.get("MetricsExportPort"),
                      "listening": sorted({(c.laddr.ip, c.laddr.port) for c in listening})}))
"""


def loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)


@pytest.mark.slow
def test_a_local_instance_listens_on_loopback_only_and_serves_no_metrics():
    import subprocess
    import sys

    # a fresh process: a Ray instance started and stopped, as a sweep does
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["node"] == "127.0.0.1"
    assert seen["listening"], "no listening socket of Ray's processes found"
    outside = [(ip, port) for ip, port in seen["listening"] if not loopback(ip)]
    assert outside == [], seen["listening"]
    export = seen["export_port"]
    assert not export or export < 0 or export not in {port for _, port in seen["listening"]}, seen


TWO_INSTANCES = """
import os
os.environ.pop("RAY_AUTH_MODE", None)
os.environ.pop("RAY_AUTH_TOKEN", None)
from ray._raylet import AuthenticationTokenLoader
assert not AuthenticationTokenLoader.instance().has_token()  # Ray has now read 'no auth' once, as CI's pytest had
from quest_bench.sweep import ray_session
for _ in range(2):
    with ray_session(None, 0) as ray:
        print(ray.get(ray.remote(lambda: 41).remote()) + 1)
"""


@pytest.mark.slow
def test_one_process_starts_a_local_instance_twice():
    """Ray's client caches the auth settings it first reads for the life of the process: a process that had asked
    Ray for a token without auth set sent none to a sweep's token-protected instance ("Missing authorization
    header", as in one pytest process), and a second instance with a new token would reject the driver."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", TWO_INSTANCES], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["42", "42"], proc.stdout


NICENESS = """
import os
from quest_bench.sweep import ray_session
os.environ.pop("RAY_worker_niceness", None)
for _ in range(2):
    with ray_session(None, 0) as ray:
        print(ray.get(ray.remote(lambda: os.nice(0)).remote()))
    os.environ["RAY_worker_niceness"] = "7"  # the caller's own choice
"""


@pytest.mark.slow
def test_runs_of_a_local_instance_get_the_sweep_s_priority_unless_the_caller_chose_one():
    """Ray starts its workers at niceness 15: beside busy processes a 2-run tiny sweep did not finish in 30 min."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", NICENESS], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "7"], proc.stdout
