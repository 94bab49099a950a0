"""The runner's test-only fault injection lives in the runner: a task's RunContext carries none of it."""

import inspect
import subprocess
import sys

import pytest

from quest_bench.runner import FaultInjectingContext
from quest_sdk.task import Diverged, RunContext


def test_the_task_context_has_no_fault_parameters():
    assert not [name for name in inspect.signature(RunContext).parameters if "fault" in name or "crash" in name]


def test_an_injected_divergence_on_one_worker_rank_only(tmp_path):
    ctx = FaultInjectingContext(tmp_path / "a", "quest", progress=False, diverge_step=3)
    ctx.check(2, 1.0)  # before the step: untouched
    with pytest.raises(Diverged, match="loss is nan") as err:
        ctx.check(3, 1.0)
    assert err.value.step == 3
    other_rank = FaultInjectingContext(tmp_path / "b", "quest", progress=False, diverge_step=3, diverge_rank=1)
    other_rank.check(5, 1.0)  # rank 0 of a one-worker run: the fault is for worker 1 only


def test_an_injected_crash_kills_the_process_at_its_step(tmp_path):
    code = ("import sys; from quest_bench.runner import FaultInjectingContext as C; "
            f"c = C({str(tmp_path)!r}, 'quest', progress=False, crash_step=4); c.check(3, 1.0); print('alive'); "
            "sys.stdout.flush(); c.check(4, 1.0); print('survived')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.split()) == (17, ["alive"])
