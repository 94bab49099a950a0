"""Test helpers for task authors: check that a task's run resumes after an interruption."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from quest_sdk.task import RunContext, SimulatedCrash


def straight_and_resumed(run: Callable, cfg, folder: Path, variant: str = "quest", seed: int = 0,
                         checkpoint_every: int = 4, crash_step: int = 6) -> tuple[dict, dict, int]:
    """``run(cfg, ctx)`` straight through in ``folder/straight``; then in ``folder/resumed`` stopped at
    ``crash_step`` (a ``SimulatedCrash``, after the checkpoint of the last multiple of ``checkpoint_every``) and
    started again. Returns (straight metrics, resumed metrics, the step the second attempt resumed from)."""

    def attempt(out: Path, **faults):
        random.seed(seed)  # the global generators, as quest_bench.runner seeds them before every run
        np.random.seed(seed)
        torch.manual_seed(seed)
        ctx = RunContext(out, variant, seed, progress=False, checkpoint_every=checkpoint_every, **faults)
        try:
            return run(cfg, ctx).metrics, ctx.resumed_from_step
        finally:
            ctx.close()

    straight, _ = attempt(Path(folder) / "straight")
    try:
        attempt(Path(folder) / "resumed", fault_crash_step=crash_step)
    except SimulatedCrash:
        pass
    else:
        raise AssertionError(f"the run never reached step {crash_step}: nothing was interrupted")
    resumed, step = attempt(Path(folder) / "resumed")
    return straight, resumed, step
