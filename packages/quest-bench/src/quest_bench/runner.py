"""Execute one RunSpec in this process: build the task's config, run it, time it, and describe the environment.

Test-only fault injection (``QUEST_BENCH_FAULTS``, comma-separated, inherited by Ray workers):
``crash_once=PATH`` kills the worker process the first time (creating PATH), so a retry must finish the run;
``crash_at_step=N`` (with ``crash_once=PATH``) kills it at training step N instead, the first time, so the retry
must resume from the last checkpoint;
``diverge_at_step=N`` turns the loss into NaN from step N, so the run must be recorded as diverged (with
``diverge_rank=R``: on data-parallel worker R only, so every worker must still stop at step N);
``raise_for_seed=N`` raises outside the task's run for seed N (a Ray task error, whose traceback must be kept);
``hang_for_seed=N`` sleeps for an hour before running seed N (a run the sweep's timeout must cancel).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import resource
import socket
import subprocess
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from quest_bench.registry import canonical_overrides, check_variant, code_version, get_task
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec, check_name
from quest_bench.store import unusable_reason
from quest_sdk.task import Diverged, RunContext

PACKAGES = ("torch", "quest-core", "quest-bench", "numpy", "ray", "timm", "torchvision", "torchaudio")


def resolve(spec: RunSpec) -> RunSpec:
    """Validate a spec (task, preset, variant, config keys) and fill in its code version; its overrides take their
    config fields' types (``registry.canonical_overrides``) before the run_id is computed."""
    for kind, name in (("task", spec.task), ("variant", spec.variant), ("preset", spec.preset)):
        check_name(kind, name)
    task = get_task(spec.task)
    check_variant(spec.variant)
    task.make_config(spec.preset, spec.overrides)
    overrides = canonical_overrides(task, spec.overrides)
    return RunSpec(spec.task, spec.variant, spec.preset, spec.seed, overrides, code_version(task))


def faults() -> dict[str, str]:
    """The test-only faults of ``QUEST_BENCH_FAULTS`` (see the module docstring), by name."""
    text = os.environ.get("QUEST_BENCH_FAULTS", "")
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


class FaultInjectingContext(RunContext):
    """Test-only: the run context of a run with faults injected, wrapping the check the engine calls after every
    optimizer step: from ``crash_step`` the worker process dies (exit code 17), from ``diverge_step`` the loss is NaN
    (on worker ``diverge_rank`` only, or on every worker when None)."""

    def __init__(self, *args, crash_step: int | None = None, diverge_step: int | None = None,
                 diverge_rank: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.crash_step, self.diverge_step, self.diverge_rank = crash_step, diverge_step, diverge_rank

    def check(self, step: int, loss: float, telemetry: dict[str, float] | None = None) -> None:
        if self.crash_step is not None and step >= self.crash_step:
            if self.world_size > 1:  # let Ray Train's controller collect the last reported checkpoint (it polls the
                time.sleep(5)        # workers every few seconds) before the worker dies
            os._exit(17)
        if self.diverge_step is not None and step >= self.diverge_step and self.diverge_rank in (None, self.rank):
            loss = math.nan
        super().check(step, loss, telemetry)


def execute(spec: RunSpec, out_dir: Path, device: str = "cpu", data_root: str | None = None,
            progress: bool = True, checkpoint_every: int = 0, rank: int = 0, world_size: int = 1,
            checkpoints=None, threads: int | None = None) -> RunResult:
    """Run one spec in ``out_dir``; every outcome (ok, diverged, failed) comes back as a RunResult, nothing is
    raised. A folder holding a checkpoint of the same spec resumes from it. ``rank``/``world_size``/``checkpoints``:
    one worker of a data-parallel run (``quest_bench.distributed``); only rank 0 writes to ``out_dir``. ``threads``:
    torch threads (default: the preset's, ``Resources.torch_threads``, so ``run`` and a sweep compute alike)."""
    import torch

    injected = faults()
    crash_step = None
    if "crash_at_step" in injected and not os.path.exists(injected["crash_once"]):
        Path(injected["crash_once"]).touch()
        crash_step = int(injected["crash_at_step"])
    elif "crash_once" in injected and not os.path.exists(injected["crash_once"]):
        Path(injected["crash_once"]).touch()
        os._exit(17)  # a worker that dies: the driver must retry
    if injected.get("raise_for_seed") == str(spec.seed):
        raise RuntimeError(f"injected fault outside the run (seed {spec.seed})")
    if injected.get("hang_for_seed") == str(spec.seed):
        time.sleep(3600)
    task = get_task(spec.task)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads or task.resources_for(spec.preset).torch_threads)
    if rank == 0:
        (Path(out_dir) / "error.txt").unlink(missing_ok=True)  # from an earlier attempt in the same folder
    result = RunResult(
        run_id=spec.run_id, task=spec.task, task_version=task.version, variant=spec.variant, preset=spec.preset,
        seed=spec.seed, overrides=dict(spec.overrides), status="ok", primary_metric=task.primary_metric,
        higher_is_better=task.higher_is_better, metric_directions=task.metric_directions(),
        validation_metric=task.validation_metric, conventions=task.conventions(),
        env=environment(device, data_root),
    )
    diverge_step = int(injected["diverge_at_step"]) if "diverge_at_step" in injected else None
    diverge_rank = int(injected["diverge_rank"]) if "diverge_rank" in injected else None
    context = dict(checkpoint_every=checkpoint_every, rank=rank, world_size=world_size, checkpoints=checkpoints,
                   run_name=f"{spec.label()} {spec.run_id[:12]}")
    if crash_step is None and diverge_step is None:
        ctx = RunContext(out_dir, spec.variant, spec.seed, device, data_root, progress, **context)
    else:
        ctx = FaultInjectingContext(out_dir, spec.variant, spec.seed, device, data_root, progress, **context,
                                    crash_step=crash_step, diverge_step=diverge_step, diverge_rank=diverge_rank)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        config = task.make_config(spec.preset, spec.overrides)
        result.config = {k: v for k, v in vars(config).items()}
        preset = task.make_config(spec.preset, {})
        result.preset_values = {k: getattr(preset, k) for k in spec.overrides}
        result.primary_metric, result.validation_metric = task.metrics_for(config)
        seed_everything(spec.seed)
        output = task.run(config, ctx)
        result.metrics, result.data = {**output.metrics, **ctx.final_metrics()}, output.data
        ctx.final({"task": spec.task, "variant": spec.variant, "preset": spec.preset, "seed": spec.seed,
                   **{f"override.{k}": v for k, v in spec.overrides.items()}}, result.metrics)
        wall = time.perf_counter() - start
        result.cost["samples_per_s"] = output.samples_seen / wall if wall > 0 else 0.0
        problem = unusable_reason(result)
        if problem:  # a run without a usable headline number is not a result
            result.status, result.reason = "failed", problem.replace("status ok but ", "")
    except Diverged as err:
        result.status, result.reason, result.diverged_step = "diverged", err.reason, err.step
    except Exception as err:  # a failed run is a result too; the traceback goes next to it
        result.status, result.reason = "failed", f"{type(err).__name__}: {err}"
        if rank == 0:
            (Path(out_dir) / "error.txt").write_text(traceback.format_exc())
    finally:
        ctx.close()
    result.telemetry = ctx.telemetry_last
    result.resumed_from_step = ctx.resumed_from_step
    result.env["workers"] = world_size
    result.cost["wall_s"] = time.perf_counter() - start
    result.cost["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device == "cuda":
        result.cost["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    result.finished_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    torch.set_num_threads(threads_before)
    return result


def seed_everything(seed: int) -> None:
    """The global generators a run may draw from (torch's, numpy's for e.g. timm's mixup, Python's), seeded from
    the run's seed, so that two runs of one spec in one process draw the same; checkpoints save their states."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def environment(device: str, data_root: str | None = None) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass  # not installed in this environment: not recorded
    import torch

    return {"packages": versions, "python": platform.python_version(), "host": socket.gethostname(),
            "device": device, "torch_threads": torch.get_num_threads(), "pid": os.getpid(), "data_root": data_root,
            **git_state()}


def git_state() -> dict:
    """The git sha and dirty flag of the project folder (``quest_bench.paths.project_root``) when it is a git
    checkout; else, as in an image built from infra/Dockerfile (no .git), the sha it was built from
    (``QUEST_BENCH_GIT_SHA``); else "unknown"."""
    from quest_bench.paths import project_root

    try:
        root = project_root()
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode == 0:
            return {"git_sha": sha.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, ValueError, subprocess.SubprocessError):
        pass  # no git on this worker: the image's sha, or unknown
    return {"git_sha": os.environ.get("QUEST_BENCH_GIT_SHA", "unknown"), "git_dirty": None}
