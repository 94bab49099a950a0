"""Run a suite on Ray: one Ray task per missing run, resources from the task preset, the driver the only writer.

With no address and no RAY_ADDRESS, a local Ray instance sized to this machine is started (and stopped after),
bound to loopback and protected by a fresh token; otherwise the sweep joins that cluster (with the token in
RAY_AUTH_TOKEN when the cluster uses token auth). What a sweep guarantees:

- resume: runs whose result.json counts as finished (ok with a finite primary metric, or diverged) are skipped;
- one driver per results folder (a lock file; a second driver refuses, or waits with ``wait=True``);
- runs that no node of the cluster can host are refused before anything runs, with what the cluster has;
- each run gets a fresh worker process (``max_calls=1``) that writes its folder directly in the results folder
  (which every node must see at the same path: a shared filesystem on a cluster), so ``events.jsonl`` and the
  TensorBoard files can be watched while it trains and checkpoints survive the worker; the driver alone writes
  ``result.json`` and the index;
- a worker that dies is retried ``max_retries`` times (also when Ray's memory monitor kills it) and the retry
  resumes from the run's last checkpoint; a run that diverges is a result, never retried; a run longer than its
  timeout is cancelled and recorded ``failed: timeout``;
- a run whose preset (or ``workers``) asks for several workers trains data-parallel through Ray Train
  (``quest_bench.distributed``);
- a failed run keeps its Python traceback in ``error.txt``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from contextlib import contextmanager
from pathlib import Path

from tqdm.auto import tqdm

from quest_bench.paths import ROOT_ENV, project_root
from quest_bench.registry import get_task
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store, in_use_message
from quest_bench.suite import Suite

POLL_S = 2.0  # how often the driver looks at finished runs and timeouts


class RunClock:
    """A Ray actor that notes when each run starts on its worker, so that the driver can cancel runs that exceed
    their timeout (time spent queued for resources does not count)."""

    def __init__(self):
        self.started: dict[str, float] = {}

    def start(self, run_id: str) -> None:
        self.started[run_id] = time.monotonic()  # a retried run starts its clock again

    def elapsed(self) -> dict[str, float]:
        now = time.monotonic()
        return {run_id: now - t for run_id, t in self.started.items()}


@dataclass(frozen=True)
class Placement:
    """Where and how one run executes: its device, data-parallel workers and the resources of each."""

    device: str  # "cpu" or "cuda"
    workers: int  # 1, or the data-parallel workers of a Ray Train run
    num_cpus: float  # per worker
    num_gpus: float  # per worker
    memory_gb: float = 0.0  # host memory reserved per worker (Ray's `memory` resource); 0 = none

    @property
    def total(self) -> str:
        gpus = f", {self.num_gpus:g} GPUs" if self.num_gpus else ""
        memory = f", {self.memory_gb:g} GiB" if self.memory_gb else ""
        return f"{self.workers} worker(s) of {self.num_cpus:g} CPUs{gpus}{memory} ({self.device})"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 2**30)


def placement(spec: RunSpec, device: str = "auto", workers: int | None = None) -> Placement:
    """The placement of a run: the preset's resources, with ``device`` ("auto": CUDA if the preset asks for GPUs)
    and ``workers`` (default: the preset's) overriding them."""
    res = get_task(spec.task).resources_for(spec.preset)
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    chosen = ("cuda" if res.num_gpus > 0 else "cpu") if device == "auto" else device
    gpus = 0.0 if chosen == "cpu" else max(float(res.num_gpus), 1.0)
    count = workers or res.workers
    if count < 1:
        raise ValueError(f"--workers must be >= 1, got {count}")
    get_task(spec.task).check_workers(count)
    return Placement(chosen, count, res.num_cpus, gpus, res.memory_gb)


def run_in_worker(spec_json: dict, run_dir: str, where: Placement, data_root: str | None, clock,
                  checkpoint_every: int, max_failures: int, mirror_uri: str | None = None) -> str:
    """Executed in a fresh Ray worker: run in the run's own folder of the results storage (or, with
    ``mirror_uri``, in a scratch folder mirrored there); return the result."""
    import ray

    os.environ.setdefault("TQDM_DISABLE", "1")
    from quest_bench.runner import execute

    spec = RunSpec.from_json(spec_json)
    ray.get(clock.start.remote(spec.run_id))
    if mirror_uri:
        return run_mirrored(spec, mirror_uri, where, data_root, checkpoint_every)
    folder = Path(run_dir)
    if not folder.parent.is_dir():
        raise ValueError(f"the results folder {folder.parent.parent} is not visible on node {socket.gethostname()}: "
                         "a sweep on a cluster needs --results on a filesystem every node mounts at the same path")
    folder.mkdir(exist_ok=True)
    if where.workers > 1:
        from quest_bench.distributed import execute_distributed

        result = execute_distributed(spec, folder, where.workers, where.device, data_root, progress=False,
                                     checkpoint_every=checkpoint_every, max_failures=max_failures,
                                     cpus_per_worker=where.num_cpus, memory_per_worker=where.memory_bytes)
    else:
        result = execute(spec, folder, device=where.device, data_root=data_root, progress=False,
                         checkpoint_every=checkpoint_every)
    return result.to_json()


def run_mirrored(spec: RunSpec, uri: str, where: Placement, data_root: str | None, checkpoint_every: int) -> str:
    """A run in a local scratch folder mirrored to ``uri`` (``quest_bench.storage``): pulled first (a retry resumes
    from the mirrored checkpoint), pushed at every checkpoint and at the end."""
    import tempfile

    from quest_bench.runner import execute
    from quest_bench.storage import MirroredCheckpoints, RunMirror

    mirror = RunMirror(uri)
    with tempfile.TemporaryDirectory(prefix="quest-bench-run-") as scratch:
        folder = Path(scratch)
        mirror.pull(folder)
        result = execute(spec, folder, device=where.device, data_root=data_root, progress=False,
                         checkpoint_every=checkpoint_every, checkpoints=MirroredCheckpoints(folder, mirror))
        mirror.push(folder)
    return result.to_json()


def failed_result(spec: RunSpec, reason: str) -> RunResult:
    task = get_task(spec.task)
    return RunResult(run_id=spec.run_id, task=spec.task, task_version=task.version, variant=spec.variant,
                     preset=spec.preset, seed=spec.seed, overrides=dict(spec.overrides), status="failed",
                     reason=reason, primary_metric=task.primary_metric, higher_is_better=task.higher_is_better)


def check_sweep_args(max_retries: int, run_timeout: float | None) -> None:
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"--max-retries must be an integer >= 0, got {max_retries!r}")
    if run_timeout is not None and not (math.isfinite(run_timeout) and run_timeout > 0):
        raise ValueError(f"--run-timeout must be a number of seconds > 0, got {run_timeout!r}")


def todo_specs(suite: Suite, store: Store) -> list[RunSpec]:
    """The suite's specs without a finished run in ``store`` (under its id, or under the id its spec had before
    overrides were canonical: ``runs.canonical_run_id``)."""
    from quest_bench.runs import canonical_run_id

    done = store.finished_ids()
    if done:
        done |= {canonical_run_id(r, store.run_dir(r.run_id)) for r in store.scan(warn=False)[0]
                 if r.run_id in done}
    return [s for s in suite.specs if s.run_id not in done]


def dry_run(suite: Suite, results_dir: Path, device: str = "auto", workers: int | None = None,
            data_root: str | None = None, clusters: list[Path] | None = None, gpu_tflops: float | None = None) -> str:
    """What a sweep would do, without Ray or a GPU: one line per run to do (workers and what each asks for, data,
    estimated GPU-hours, timeout, and whether each cluster manifest in ``clusters`` can host it; default: the
    shipped manifests in the project's ``infra/``, ``quest_bench.paths``), then the totals and where the estimates
    come from."""
    from quest_bench.cluster import fits, load_cluster
    from quest_bench.paths import infra_dir
    from quest_sdk.task import ASSUMED_GPU_TFLOPS

    tflops = gpu_tflops or ASSUMED_GPU_TFLOPS
    manifests = [Path(c) for c in clusters] if clusters else [p for p in (infra_dir() / n for n in SHIPPED_CLUSTERS)
                                                              if p.exists()]
    nodes = {m.name: load_cluster(m) for m in manifests}
    store = Store(Path(results_dir) / suite.name)
    todo = todo_specs(suite, store)
    lines = [f"suite {suite.name}: {len(suite.specs)} runs, {len(todo)} to run -> {store.root}; data root: "
             f"{data_root or '(none: tasks use their shipped or generated data)'}"]
    if suite.confirm:  # tune, then confirm (sweep_in_stages): stage 2's cells are known once stage 1 has finished
        from quest_bench import tuning

        stage_two, _ = tuning.confirmation_specs(suite, store.scan(warn=False)[0])
        todo = todo or todo_specs(replace(suite, specs=stage_two, confirm=()), store)
        chosen = len({(s.task, s.preset, s.variant) for s in suite.specs})
        lines.append(f"stage 2 (confirm): {chosen} chosen cells × {len(suite.confirm)} fresh seeds = "
                     f"{chosen * len(suite.confirm)} runs, " + ("listed below" if stage_two else
                                                             "planned once every stage-1 run has finished"))
    cpus = gpus = gpu_hours = 0.0
    unestimated, refused, bases = 0, {name: 0 for name in nodes}, {}
    for spec in todo:
        where, task = placement(spec, device, workers), get_task(spec.task)
        res = task.resources_for(spec.preset)
        cpus, gpus = cpus + where.num_cpus * where.workers, gpus + where.num_gpus * where.workers
        dataset = getattr(task.make_config(spec.preset, spec.overrides), "dataset", None)
        mem = f", {where.memory_gb:g} GiB" if where.memory_gb else ""
        if res.throughput is not None and where.num_gpus:
            hours = res.throughput.gpu_hours(tflops)
            gpu_hours += hours
            estimate = f"est. {hours:.3g} GPU-h"
            bases[f"{spec.task}/{spec.preset}"] = res.throughput.basis
        else:
            estimate = "no GPU-h estimate"
            unestimated += 1
        where_ok = []
        for name, cluster in nodes.items():
            ok, why = fits(cluster, where.workers, where.num_cpus, where.num_gpus, where.memory_gb)
            refused[name] += not ok
            where_ok.append(f"{name}: {'fits' if ok else why}")
        lines.append(f"  {spec.label():40s} {where.workers} x ({where.num_cpus:g} CPUs, {where.num_gpus:g} GPUs{mem}, "
                     f"{where.device}); data {dataset or 'default'}; {estimate}; timeout "
                     f"{task.timeout_for(spec.preset) / 3600:.3g} h; {'; '.join(where_ok)}  {spec.run_id[:12]}")
    lines.append(f"to run: {len(todo)} runs asking for {cpus:g} CPUs and {gpus:g} GPUs in all (they queue for what "
                 f"the cluster has); estimated {gpu_hours:.4g} GPU-hours at an assumed sustained {tflops:g} TFLOP/s "
                 f"per GPU" + (f" ({unestimated} runs without an estimate)" if unestimated else ""))
    for name, count in refused.items():
        lines.append(f"cluster {name}: " + (f"{count} runs cannot be placed" if count else "every run can be placed"))
    if bases:
        lines.append("estimates (training FLOPs / the sustained rate; --gpu-tflops to calibrate, e.g. from "
                     "`make gpu-check`):")
        lines.extend(f"  {key}: {basis}" for key, basis in bases.items())
    return "\n".join(lines)


SHIPPED_CLUSTERS = ("cluster.yaml", "kuberay-rayjob.yaml")  # under infra/: what a dry run checks by default


def run_sweep(suite: Suite, results_dir: Path, address: str | None = None, data_root: str | None = None,
              max_retries: int = 2, run_timeout: float | None = None, wait: bool = False,
              wait_for_resources: bool = False, progress: bool = True, device: str = "auto",
              workers: int | None = None, checkpoint_every: int = 0, storage: str | None = None) -> dict[str, int]:
    """Run every missing spec of ``suite``; returns counts by status for this invocation (plus 'skipped').

    ``run_timeout``: seconds per run (default: each preset's, ``Task.timeout_for``). ``wait``: queue behind another
    driver of the same results folder instead of refusing. ``wait_for_resources``: submit runs that no node can
    host yet (an autoscaling cluster adds the nodes) instead of refusing them. ``device`` and ``workers`` override
    every preset's (``placement``); ``checkpoint_every``: steps between checkpoints (0: ten per run). ``storage``: a
    URI where the runs keep their folders while they train (``quest_bench.storage``), for clusters whose nodes do
    not mount the results folder. A confirming suite (``Suite.confirm``) runs in two stages: ``sweep_in_stages``.
    """
    if suite.confirm:
        options = {k: v for k, v in locals().items() if k not in ("suite", "results_dir")}
        return sweep_in_stages(suite, Path(results_dir), options)
    check_sweep_args(max_retries, run_timeout)
    store = Store(Path(results_dir) / suite.name)
    todo = todo_specs(suite, store)
    counts = {"skipped": len(suite.specs) - len(todo), "ok": 0, "diverged": 0, "failed": 0}
    if not todo:  # nothing to write: works on a read-only results folder
        print(f"suite {suite.name}: all {len(suite.specs)} runs already finished in {store.root}", file=sys.stderr)
        return counts
    holder = store.lock_holder()
    if holder and not wait:  # refused before Ray starts (and again, race-free, when the lock is taken below)
        raise ValueError(in_use_message(store.root, holder))
    places = {spec.run_id: placement(spec, device, workers) for spec in todo}
    if storage:
        from quest_bench.storage import check_storage

        check_storage(storage)
        if any(p.workers > 1 for p in places.values()):
            raise ValueError("--storage with data-parallel runs (workers > 1) is not supported: put --results on a "
                             "filesystem every node mounts, or pass --workers 1")
    with ray_session(address, max_retries) as ray:
        if not wait_for_resources:  # refused before anything is written
            check_feasible(todo, places, ray.nodes())
        waiting = infeasible(todo, places, ray.nodes()) if wait_for_resources else {}
        for run_id, need in waiting.items():  # no silent waits: what each run waits for, and for how long
            spec = next(s for s in todo if s.run_id == run_id)
            print(f"waiting for resources: {need}; giving up after "
                  f"{run_timeout or get_task(spec.task).timeout_for(spec.preset):g} s (--run-timeout)", file=sys.stderr)
        with store.lock(wait):
            store.load(warn=False)  # the index in line with the run folders: a driver killed between a run's result.json and
            # its index row left the run out of the index
            todo = todo_specs(suite, store)  # another driver may have finished some while we waited for the lock
            counts["skipped"] = len(suite.specs) - len(todo)
            print(f"suite {suite.name}: {len(suite.specs)} runs, {counts['skipped']} already finished, {len(todo)} "
                  f"to run -> {store.root}", file=sys.stderr)
            if todo:
                run_specs(ray, todo, places, store, counts, data_root, max_retries, run_timeout, progress,
                          checkpoint_every, storage, waiting)
    return counts


def infeasible(specs: list[RunSpec], places: dict[str, Placement], nodes: list[dict]) -> dict[str, str]:
    """The runs that the alive nodes cannot host now, each with what it needs and what the nodes have."""
    out = {}
    for spec in specs:
        try:
            check_feasible([spec], places, nodes)
        except ValueError as err:
            out[spec.run_id] = str(err).split(". Use a smaller preset")[0]
    return out


def sweep_in_stages(suite: Suite, results_dir: Path, options: dict) -> dict[str, int]:
    """Tune, then confirm: stage 1 (the suite's specs, the search), then, once every stage-1 run has finished, stage
    2 (``tuning.confirmation_specs``: each variant's chosen cell with the fresh seeds), in the same results folder.
    Each stage resumes like any sweep, so running the same command again continues where it stopped."""
    from quest_bench import tuning

    counts = run_sweep(replace(suite, confirm=()), results_dir, **options)
    specs, notes = tuning.confirmation_specs(suite, Store(results_dir / suite.name).scan(warn=False)[0])
    for note in notes:
        print(f"suite {suite.name}: {note}", file=sys.stderr)
    if specs:
        print(f"suite {suite.name}: stage 2 (confirm): {len(specs)} runs, each variant's chosen cell with seeds "
              f"{', '.join(map(str, suite.confirm))}", file=sys.stderr)
        more = run_sweep(replace(suite, specs=specs, confirm=()), results_dir, **options)
        counts = {k: counts[k] + more[k] for k in counts}
    return counts


# A local instance: token auth with a fresh token, and Ray's single-machine mode, in which every Ray process (GCS,
# raylet, workers, agents) binds to 127.0.0.1 instead of all interfaces. Ray reads both from the environment of
# the driver, which its processes inherit. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is Ray's switch for that mode
# (the default on macOS and Windows); it is read when ray is imported, hence also set on ray_constants below.
LOCAL_RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's metrics (a Prometheus endpoint per node, which Ray serves without authentication, on 127.0.0.1 in
# single-machine mode) are off for a local instance: the raylet then starts its agent with
# --disable-metrics-collection, and no metrics export port is opened. Nothing here reads them.
NO_METRICS = {"enable_metrics_collection": False}


def reload_ray_auth() -> None:
    """Make Ray's client re-read its auth settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN) from the environment. It reads
    them once per process and keeps them: a process that touched Ray before (an earlier ``ray.init`` without auth,
    or anything that asked for the token) would otherwise send no token to a token-protected instance ("Missing
    authorization header", and the start fails). The same two calls as Ray's own test helper
    ``ray._private.authentication_test_utils.reset_auth_token_state``."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@functools.cache
def local_ray_token() -> str:
    """The token of this process's local Ray instances: fresh per process, and the same for every instance it starts,
    since Ray's client caches the first token it reads for the life of the process (a second local instance with a
    new token would reject the driver: "InvalidAuthToken")."""
    return secrets.token_hex(32)


def is_loopback(address: str) -> bool:
    """Whether a Ray address (host:port, ray://host:port) names this machine's loopback interface."""
    import ipaddress

    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def ray_session(address: str | None, max_retries: int):
    """Join ``address`` (or RAY_ADDRESS; with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN set as that cluster needs),
    or start a local Ray instance bound to loopback and protected by a fresh token that lives only in the
    environment of this process and its children (nothing is written to the home folder). Retries of runs killed
    for memory are bounded by ``max_retries`` (Ray's default is unlimited). Yields the ray module."""
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray
        from ray._private import ray_constants

        saved_mode, saved_flag = os.environ.get(SINGLE_MACHINE), ray_constants.ENABLE_RAY_CLUSTER
        if is_loopback(address):  # the driver stays on 127.0.0.1 too (Ray would take the machine's network address)
            os.environ[SINGLE_MACHINE], ray_constants.ENABLE_RAY_CLUSTER = "0", False
        try:
            reload_ray_auth()
            init_keeping_sigterm(ray, address=address, log_to_driver=False)
            yield ray
        finally:
            ray.shutdown()
            if saved_mode is None:
                os.environ.pop(SINGLE_MACHINE, None)
            else:
                os.environ[SINGLE_MACHINE] = saved_mode
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        return
    saved = {k: os.environ.get(k) for k in (*LOCAL_RAY_ENV, "RAY_AUTH_TOKEN")}
    os.environ.update(LOCAL_RAY_ENV, RAY_AUTH_TOKEN=local_ray_token())
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before the variable was set
    try:
        reload_ray_auth()
        start_local_ray(ray, num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                        _system_config={"task_oom_retries": max_retries, **NO_METRICS},
                        runtime_env={"env_vars": {"TQDM_DISABLE": "1", ROOT_ENV: str(project_root())}})
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():  # the token goes with the instance
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reload_ray_auth()
        ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR,
                                                                  not ray_constants.IS_WINDOWS_OR_OSX)


class RayStartError(RuntimeError):
    """A local Ray instance did not start, twice: the command line says why in one line and exits 1."""


# Ray's own start-up waits (ray/_private/node.py and the raylet's RayConfig, Ray 2.60) are 30 s each, fixed: on a
# machine whose load is several times its cores, the GCS, the raylet and its agents start slower than that.
STARTUP_WAIT_S = 30.0
STARTUP_WAIT_MAX_S = 600.0


def startup_wait_s(attempt: int = 0) -> float:
    """Seconds each of Ray's start-up steps may take: its 30 s scaled by the load per core (at least 1), doubled on
    the retry, at most ``STARTUP_WAIT_MAX_S``."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(STARTUP_WAIT_MAX_S, STARTUP_WAIT_S * max(1.0, load) * (1 + attempt))


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct TCP ports free right now (the components that get them bind them within seconds; a port
    taken in between fails the start, which ``start_local_ray`` tries once more with new ports)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


# The agent ports ``ray.init`` does not take (``ray start`` does). Left unset, the dashboard agent's HTTP port is
# the fixed 52365, which a second instance on the machine cannot bind, and the others are bound by the agents and
# reported through files that the raylet waits for only briefly, a fixed 15 s (a raylet under load dies with
# "Timed out waiting for file .../metrics_agent_port_<node>" while the agent is still importing). With every port
# given, and the HTTP port passed to the raylet too (``ray.init`` leaves its --dashboard_agent_listen_port out),
# the raylet waits for no file.
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "runtime_env_agent_port", "dashboard_agent_listen_port")


WORKER_NICENESS = "RAY_worker_niceness"  # read by the raylet when it starts; Ray's default is 15


def startup_wait_env(wait_s: float) -> dict[str, str]:
    """Ray's start-up waits (read from the environment by its processes) scaled to ``wait_s`` seconds."""
    return {"RAY_gcs_server_port_wait_time_s": str(int(wait_s)),
            "RAY_agent_register_timeout_ms": str(int(wait_s * 1000)),
            "RAY_raylet_start_wait_time_s": str(int(wait_s)),
            "RAY_worker_register_timeout_seconds": str(int(max(60.0, wait_s)))}


@contextmanager
def startup_settings(wait_s: float):
    """What a local Ray instance needs to start beside other instances on a busy machine, for the time of
    ``ray.init`` only:

    - every port free: the GCS, raylet and object manager bind their own; the agents get free ports chosen here
      (``AGENT_PORTS``), and the dashboard process one passed to ``ray.init``;
    - Ray's start-up waits scaled to ``wait_s``: the GCS port (``RAY_gcs_server_port_wait_time_s``), the agents'
      registration with the raylet (``RAY_agent_register_timeout_ms``), worker registration
      (``RAY_worker_register_timeout_seconds``), the dashboard process (``RAY_DASHBOARD_STARTUP_TIMEOUT_S``) and the
      driver's wait for the raylet to register, a fixed 30 s loop around ``services.get_node`` in ``Node.__init__``
      (each call is retried here until ``wait_s`` has passed);
    - the runs at the sweep's own priority: Ray starts its workers at niceness 15, so on a machine where other
      processes keep the cores busy they got ~2% of a core each and a 2-run tiny sweep did not finish in 30 minutes;
      ``RAY_worker_niceness`` is 0 unless the caller set it (a value in the environment is kept);
    - Ctrl-C and SIGTERM stay with the caller: Ray's own SIGTERM handler (``sys.exit`` in the middle of start-up)
      is not installed, so the command line's handler stops the start-up like Ctrl-C.
    """
    import ray._private.parameter as parameter
    import ray._private.services as services
    import ray._private.utils as ray_utils
    from ray._private import ray_constants

    knobs = {**startup_wait_env(wait_s), WORKER_NICENESS: os.environ.get(WORKER_NICENESS, "0")}
    saved_env = {k: os.environ.get(k) for k in knobs}
    saved = (parameter.RayParams, services.get_node, ray_utils.set_sigterm_handler,
             ray_constants.RAY_DASHBOARD_STARTUP_TIMEOUT_S, services.start_ray_process)
    base_params, base_get_node, base_start = saved[0], saved[1], saved[4]

    class FreePortParams(base_params):
        def __init__(self, *args, **kwargs):
            unset = [key for key in AGENT_PORTS if not kwargs.get(key)]
            kwargs.update(zip(unset, free_ports(len(unset))))
            super().__init__(*args, **kwargs)

    def patient_get_node(*args, **kwargs):
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return base_get_node(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_telling_the_raylet(command, process_type, *args, **kwargs):
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            port = re.search(r"--listen-port=(\d+)", " ".join(command))
            if port and int(port.group(1)):
                command = [*command, f"--dashboard_agent_listen_port={port.group(1)}"]
        return base_start(command, process_type, *args, **kwargs)

    os.environ.update(knobs)
    parameter.RayParams, services.get_node = FreePortParams, patient_get_node
    services.start_ray_process = start_telling_the_raylet
    ray_utils.set_sigterm_handler = lambda handler: None
    ray_constants.RAY_DASHBOARD_STARTUP_TIMEOUT_S = int(wait_s)
    try:
        yield
    finally:
        (parameter.RayParams, services.get_node, ray_utils.set_sigterm_handler,
         ray_constants.RAY_DASHBOARD_STARTUP_TIMEOUT_S, services.start_ray_process) = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_local_ray(ray, attempts: int = 2, **kwargs) -> None:
    """``ray.init`` of a local instance with ``startup_settings``: a failed start is cleaned up and tried once more
    with longer waits; if that fails too, ``RayStartError`` says why in one line. Ctrl-C (KeyboardInterrupt)
    stops the start-up and what it had started."""
    problem = ""
    for attempt in range(attempts):
        wait_s = startup_wait_s(attempt)
        if attempt:
            print(f"note: Ray did not start ({problem}); trying once more, waiting up to {wait_s:.0f} s per step",
                  file=sys.stderr)
        else:
            print(f"starting a local Ray instance (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: "
                  f"waiting up to {wait_s:.0f} s per start-up step)", file=sys.stderr, flush=True)
        try:
            with startup_settings(wait_s):
                init_keeping_sigterm(ray, dashboard_port=free_port(), **kwargs)
            return
        except (KeyboardInterrupt, SystemExit):
            ray.shutdown()
            raise KeyboardInterrupt from None
        except Exception as err:  # Ray raises bare Exceptions (and RuntimeError, ConnectionError) on start-up
            problem = (str(err).strip().splitlines() or [type(err).__name__])[0]
            ray.shutdown()
    load = os.getloadavg()[0]
    raise RayStartError(f"could not start a local Ray instance ({attempts} tries; the last waited up to "
                        f"{wait_s:.0f} s per step, load average {load:.1f} on "
                        f"{os.cpu_count()} cores): {problem} Try again when the machine is less busy, or start Ray "
                        "yourself (`ray start --head`) and pass --address (Ray's logs: "
                        f"{Path(os.environ.get('RAY_TMPDIR') or tempfile.gettempdir()) / 'ray' / 'session_latest' / 'logs'})")


def init_keeping_sigterm(ray, **kwargs) -> None:
    """``ray.init``, keeping the SIGTERM handler the caller had: Ray's own exits in the middle of its shutdown, and the
    process then aborts; the command line's stops a sweep like Ctrl-C (runs cancelled, the same command resumes)."""
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(**kwargs)
    if threading.current_thread() is threading.main_thread() and handler is not None:
        signal.signal(signal.SIGTERM, handler)


def check_feasible(specs: list[RunSpec], places: dict[str, Placement], nodes: list[dict]) -> None:
    """Refuse runs that the alive nodes cannot host (e.g. a GPU preset on a CPU-only machine; more data-parallel
    workers than fit), naming what there is."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    memory = any(places[spec.run_id].memory_bytes for spec in specs)  # shown when a run reserves memory
    have = "; ".join(f"{r.get('CPU', 0):g} CPUs, {r.get('GPU', 0):g} GPUs"
                     + (f", {r.get('memory', 0) / 2**30:.3g} GiB" if memory else "") for r in alive) or "no nodes"
    for spec in specs:
        need = places[spec.run_id]
        fits = sum(int(min(r.get("CPU", 0) // need.num_cpus if need.num_cpus else need.workers,
                           r.get("GPU", 0) // need.num_gpus if need.num_gpus else need.workers,
                           r.get("memory", 0) // need.memory_bytes if need.memory_bytes else need.workers))
                   for r in alive)
        if fits < need.workers:
            raise ValueError(f"run {spec.label()} needs {need.total}, but the cluster's nodes have: {have}. Use a "
                             "smaller preset, fewer --workers, or on an autoscaling cluster pass --wait-for-resources")


def run_specs(ray, todo: list[RunSpec], places: dict[str, Placement], store: Store, counts: dict,
              data_root: str | None, max_retries: int, run_timeout: float | None, progress: bool,
              checkpoint_every: int, storage: str | None = None, waiting: dict[str, str] | None = None) -> None:
    """Submit every run and collect its result. ``waiting``: runs no node could host when submitted (with
    ``--wait-for-resources``), by run_id with what they need: one that has neither started nor become placeable
    within its timeout is cancelled and recorded ``failed`` with that reason."""
    from quest_bench.storage import RunMirror, run_uri

    waiting, submitted = dict(waiting or {}), time.monotonic()

    clock = ray.remote(num_cpus=0)(RunClock).remote()
    remote = ray.remote(max_calls=1)(run_in_worker)  # a fresh worker process per run (max_calls is not an option)
    store.runs_dir.mkdir(parents=True, exist_ok=True)
    pending, timeouts = {}, {}
    for spec in todo:
        link_tensorboard(store, spec)
        task, where = get_task(spec.task), places[spec.run_id]
        # a data-parallel run's own task only drives Ray Train, whose workers hold the resources
        cpus, gpus = (0, 0) if where.workers > 1 else (where.num_cpus, where.num_gpus)
        memory = {"memory": where.memory_bytes} if where.memory_bytes and where.workers == 1 else {}
        ref = remote.options(num_cpus=cpus, num_gpus=gpus, max_retries=max_retries, name=spec.label(),
                             **memory).remote(
            spec.to_json(), str(store.run_dir(spec.run_id).resolve()), where, data_root, clock, checkpoint_every,
            max_retries, run_uri(storage, store.root.name, spec.run_id) if storage else None)
        pending[ref] = spec
        timeouts[spec.run_id] = run_timeout or task.timeout_for(spec.preset)
    bar = tqdm(total=len(todo), desc="sweep", disable=not progress, dynamic_ncols=True)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                spec = pending.pop(ref)
                if storage:  # the run's folder, from where it trained, next to the result the driver writes
                    RunMirror(run_uri(storage, store.root.name, spec.run_id)).pull(store.run_dir(spec.run_id))
                finish(store, spec, *outcome(ray, ref, spec, max_retries), counts, bar)
            try:
                elapsed = ray.get(clock.elapsed.remote())
            except ray.exceptions.RayError as err:
                raise ValueError(f"the sweep's run clock (a Ray actor) was lost ({type(err).__name__}); run the "
                                 "same command again to resume") from None
            for ref, spec in list(pending.items()):
                if elapsed.get(spec.run_id, 0.0) > timeouts[spec.run_id] and not ray.wait([ref], timeout=0)[0]:
                    ray.cancel(ref, force=True)  # kills the worker process; cancelled tasks are not retried
                    del pending[ref]
                    reason = f"timeout: still running after {timeouts[spec.run_id]:g} s (--run-timeout)"
                    finish(store, spec, failed_result(spec, reason), reason + "\n", counts, bar)
            for run_id in [r for r in waiting if r in elapsed]:  # started: its timeout runs from now on
                del waiting[run_id]
            late = [(ref, spec) for ref, spec in pending.items() if spec.run_id in waiting
                    and time.monotonic() - submitted > timeouts[spec.run_id]]
            still = infeasible([spec for _, spec in late], places, ray.nodes()) if late else {}
            for ref, spec in late:
                need = waiting.pop(spec.run_id)
                if spec.run_id not in still:  # placeable now (the cluster grew): it queues like any other run
                    continue
                ray.cancel(ref, force=True)
                del pending[ref]
                reason = (f"timeout: waited {timeouts[spec.run_id]:g} s for resources no node has (--run-timeout): "
                          f"{need}")
                finish(store, spec, failed_result(spec, reason), reason + "\n", counts, bar)
    finally:
        bar.close()
        for ref in pending:  # interrupted: stop what still runs (a local instance stops with the driver anyway)
            ray.cancel(ref, force=True)


def outcome(ray, ref, spec: RunSpec, max_retries: int) -> tuple[RunResult, str | None]:
    """The result of a finished Ray task, and the error text the driver must keep (None: the run wrote its own);
    Ray's own errors become failed results that keep the reason."""
    try:
        return RunResult.from_dict(json.loads(ray.get(ref))), None
    except ray.exceptions.RayTaskError as err:  # a Python exception outside the task's own run (import, I/O)
        cause = err.cause if isinstance(err.cause, BaseException) else None
        reason = f"{type(cause).__name__}: {cause}" if cause else str(err).splitlines()[-1]
        return failed_result(spec, reason), str(err)
    except ray.exceptions.OutOfMemoryError as err:
        reason = f"out of memory: killed by Ray's memory monitor on every attempt ({max_retries} retries)"
        return failed_result(spec, reason), str(err)
    except ray.exceptions.RayError as err:  # the worker process died on every attempt
        reason = f"worker died on every attempt ({max_retries} retries): {type(err).__name__}"
        return failed_result(spec, reason), str(err)
    except ValueError as err:  # a result that does not fit the schema (e.g. a metric that is not a number); after
        reason = f"the run returned an invalid result: {err}"  # RayTaskError, which may also be a ValueError
        return failed_result(spec, reason), reason


def finish(store: Store, spec: RunSpec, result: RunResult, error: str | None, counts: dict, bar) -> None:
    write_run(store, spec, result, error)
    counts[result.status] += 1
    value = result.metrics.get(result.primary_metric)
    shown = f"{result.primary_metric}={value:.4g}" if isinstance(value, (int, float)) else result.reason
    wall = result.cost.get("wall_s")
    bar.write(f"{result.status:8s} {spec.label()}  {shown}" + (f"  ({wall:.0f} s)" if wall is not None else ""),
              file=sys.stderr)
    bar.set_postfix(ok=counts["ok"], diverged=counts["diverged"], failed=counts["failed"], refresh=False)
    bar.update(1)


def link_tensorboard(store: Store, spec: RunSpec) -> Path:
    """``<suite>/tensorboard/<task>/<variant>/<preset>/seed<N>[overrides]``: a link to the run's TensorBoard folder,
    so that ``tensorboard --logdir <results>/<suite>/tensorboard`` names each run by what it is, not by its id."""
    parts = [re.sub(r"[^A-Za-z0-9._=,+\[\]-]", "_", part) for part in spec.label().split("/")]
    link = store.root.joinpath("tensorboard", *parts)
    target = store.run_dir(spec.run_id) / "tensorboard"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)
    return link


def write_run(store: Store, spec: RunSpec, result: RunResult, error: str | None) -> None:
    """The driver's part of a run folder: ``error.txt`` for failures the run could not record itself, then
    ``result.json`` and the index (the run wrote everything else there while it trained)."""
    folder = store.run_dir(spec.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    if error is not None:
        (folder / "error.txt").write_text(error if error.endswith("\n") else error + "\n")
    elif result.status != "failed":
        (folder / "error.txt").unlink(missing_ok=True)  # left by an earlier failed attempt
    store.write(spec, result)
