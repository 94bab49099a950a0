"""Divergence is decided globally in data-parallel training: 2 CPU workers (gloo, forked processes) train one model
through the engine; when one worker alone sees a NaN loss or an exploding attention logit, both stop at the same step
with Diverged (instead of the healthy worker dying in its next all-reduce)."""

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from quest_core import MultiheadAttention
from quest_sdk.engine import Trainer, TrainSpec
from quest_sdk.task import Diverged, RunContext
from quest_sdk.testing import gloo_workers

WORLD = 2
JOIN_S = 300  # generous: a healthy pair finishes in seconds; a broken one would hang in an all-reduce


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.attn = MultiheadAttention(8, 2, variant="softmax", batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x_bn3):
        h_bnd = self.embed(x_bn3)
        return self.head(self.attn(h_bnd, h_bnd, h_bnd, need_weights=False)[0].mean(1))


class NanFrom(RunContext):
    """A worker whose loss is NaN from ``step`` on, when it is worker ``rank``."""

    def __init__(self, *args, nan_step: int | None, nan_rank: int | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.nan_step, self.nan_rank = nan_step, nan_rank

    def check(self, step, loss, telemetry=None):
        nan_here = self.nan_step is not None and step >= self.nan_step and self.rank == self.nan_rank
        super().check(step, math.nan if nan_here else loss, telemetry)


def worker(rank: int, out: str, faults: dict) -> tuple:
    """One worker: train 8 steps on its own batches; how it ended."""
    torch.manual_seed(0)
    model = Tiny()
    ctx = NanFrom(Path(out) / f"rank{rank}", "softmax", seed=0, progress=False, rank=rank, world_size=WORLD,
                  max_logit=faults.get("max_logit", 1e4), nan_step=faults.get("step"), nan_rank=faults.get("rank"))
    trainer = Trainer(model, ctx, TrainSpec(steps=8, lr=1e-3, weight_decay=0.0, log_every=1), "test")
    scale = faults.get("input_scale", {}).get(rank, 1.0)  # a worker whose inputs blow its logits up

    def batches(start):
        gen = torch.Generator().manual_seed(rank)
        while True:
            yield scale * torch.randn(4, 5, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen)

    def loss_fn(m, batch, rng):
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)

    try:
        trainer.fit(batches, loss_fn)
        return "finished", trainer.step, ""
    except Diverged as err:
        return "diverged", err.step, err.reason
    finally:
        ctx.close()


def run_pair(tmp_path, faults: dict) -> dict[int, tuple]:
    """Both workers' outcomes; a worker that raised anything but Diverged (e.g. a collective that lost its peer)
    comes back as ("error", traceback)."""
    return gloo_workers(worker, WORLD, str(tmp_path), faults, timeout_s=JOIN_S)


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_nan_loss_on_one_worker_stops_every_worker_at_the_same_step(tmp_path, bad_rank):
    outcomes = run_pair(tmp_path, {"step": 3, "rank": bad_rank})
    assert outcomes[0][:2] == outcomes[1][:2] == ("diverged", 3)
    assert all(f"loss is nan on worker {bad_rank} of 2" in reason for _, _, reason in outcomes.values())


def test_an_exploding_logit_on_one_worker_is_seen_by_every_worker(tmp_path):
    # worker 1's inputs are 1e4 times larger: only its local batch has attention logits above the limit
    outcomes = run_pair(tmp_path, {"max_logit": 50.0, "input_scale": {1: 1e4}})
    assert outcomes[0][:2] == outcomes[1][:2] == ("diverged", 1)  # checked after the first step, on both
    logits = {float(reason.split()[3]) for _, _, reason in outcomes.values()}
    assert len(logits) == 1 and logits.pop() > 50.0  # the same, global maximum on both


def test_healthy_workers_train_to_the_end(tmp_path):
    outcomes = run_pair(tmp_path, {})
    assert outcomes == {0: ("finished", 8, ""), 1: ("finished", 8, "")}
    rows = [json.loads(line) for line in (tmp_path / "rank0" / "events.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9)) and all(math.isfinite(r["loss"]) for r in rows)
    assert not (tmp_path / "rank1").exists()  # only the main worker writes
