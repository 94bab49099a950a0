"""Test helpers for task authors: check that a task's run resumes after an interruption."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from quest_sdk.task import RunContext


class SimulatedCrash(Exception):
    """A run stopped mid-training (``CrashingContext``), as if its process died after its last checkpoint."""


class CrashingContext(RunContext):
    """A run context whose run stops with ``SimulatedCrash`` at optimizer step ``crash_step``."""

    def __init__(self, *args, crash_step: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.crash_step = crash_step

    def check(self, step: int, loss: float, telemetry: dict[str, float] | None = None) -> None:
        if step >= self.crash_step:
            raise SimulatedCrash(f"simulated crash at step {step}")
        super().check(step, loss, telemetry)


def straight_and_resumed(run: Callable, cfg, folder: Path, variant: str = "quest", seed: int = 0,
                         checkpoint_every: int = 4, crash_step: int = 6) -> tuple[dict, dict, int]:
    """``run(cfg, ctx)`` straight through in ``folder/straight``; then in ``folder/resumed`` stopped at
    ``crash_step`` (a ``SimulatedCrash``, after the checkpoint of the last multiple of ``checkpoint_every``) and
    started again. Returns (straight metrics, resumed metrics, the step the second attempt resumed from); the metrics
    include the ``final_*`` telemetry the runner adds (``RunContext.final_metrics``)."""

    def attempt(out: Path, context: type = RunContext, **kwargs):
        random.seed(seed)  # the global generators, as quest_bench.runner seeds them before every run
        np.random.seed(seed)
        torch.manual_seed(seed)
        ctx = context(out, variant, seed, progress=False, checkpoint_every=checkpoint_every, **kwargs)
        try:
            return {**run(cfg, ctx).metrics, **ctx.final_metrics()}, ctx.resumed_from_step  # as the runner records
        finally:
            ctx.close()

    straight, _ = attempt(Path(folder) / "straight")
    try:
        attempt(Path(folder) / "resumed", CrashingContext, crash_step=crash_step)
    except SimulatedCrash:
        pass
    else:
        raise AssertionError(f"the run never reached step {crash_step}: nothing was interrupted")
    resumed, step = attempt(Path(folder) / "resumed")
    return straight, resumed, step


def gloo_workers(target: Callable, world_size: int, *args, timeout_s: float = 300.0) -> dict[int, object]:
    """``target(rank, *args)`` in ``world_size`` forked CPU processes joined in one ``torch.distributed`` gloo group
    (as Ray Train's workers are): what each returned, by rank, or ``("error", text)`` for one that raised. A worker
    still running after ``timeout_s`` (e.g. stuck in a collective its peer left) is killed and reported as
    ``("timeout", ...)``. For tests of data-parallel code paths without Ray."""
    import multiprocessing
    import os
    import queue as queues
    import socket
    import traceback

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def main(rank, results):
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            results.put((rank, target(rank, *args)))
        except BaseException:
            results.put((rank, ("error", traceback.format_exc())))
        finally:
            dist.destroy_process_group()

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=main, args=(rank, results)) for rank in range(world_size)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world_size):
            rank, value = results.get(timeout=timeout_s)
            out[rank] = value
    except queues.Empty:
        out.update({r: ("timeout", f"no result after {timeout_s:g} s") for r in range(world_size) if r not in out})
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out
