"""The training engine every hand-written task trains through, so that every variant in every domain is optimised,
logged, checked and checkpointed the same way.

A task builds its model and says how to make a batch and its loss; ``Trainer.fit`` owns the rest:

- AdamW over ``decay_groups``, linear warm-up then cosine decay to ``min_lr_ratio`` (``warmup_cosine``), all in
  optimizer steps: ``TrainSpec.from_config`` converts a task's ``quest_sdk.config.TrainingConfig`` (epochs with
  ``steps_per_epoch``) once;
- bf16 autocast (``amp``), gradient clipping (``grad_clip``; the gradient norm is logged either way);
- the divergence check and identical per-layer attention telemetry in ``events.jsonl`` every ``log_every`` steps;
- checkpoints of model, optimizer, scheduler, random states and watcher states every ``ctx.checkpoint_every``
  steps and at the end; a run started again in the same folder resumes from its last checkpoint and ends with the
  same numbers as an uninterrupted run (bitwise on a CPU with the same thread count);
- data-parallel training when ``ctx`` says it is one of several workers (``torch.distributed`` initialised by
  Ray Train): the model is wrapped in DDP and each worker takes its share of every global batch; divergence is
  decided for all workers at once (``RunContext.check``); evaluations can be sharded the same way (``rank_shard``,
  ``reduce_sums``: each worker scores its share, the counts are summed).

Randomness that decides the data (which examples, which augmentation) comes from ``Trainer.rng(step)``, a generator
derived from (seed, step) alone, so the data of step s is the same whether or not the run was interrupted before it.
"""

from __future__ import annotations

import copy
import math
import random
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import torch
from torch import nn

from quest_core import Telemetry, no_weight_decay, summarize

CHECKPOINT_VERSION = 1


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on weight matrices and embeddings only.

    Not decayed: 1-D parameters (biases, norm weights), the attention variants' parameters whose declaration says
    so (``quest_core.no_weight_decay``: e.g. the qknorm and cosine temperatures, whatever their shape: decaying them
    would pull the temperature toward 0), and the names a model lists in ``no_weight_decay()`` (timm's
    convention, e.g. CLS tokens and position embeddings; the names are relative to the module that defines it).
    """
    skip = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "no_weight_decay"):
            skip |= {f"{prefix}.{n}" if prefix else n for n in module.no_weight_decay()}
    variant_params = no_weight_decay(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        quiet = p.ndim < 2 or id(p) in variant_params or name in skip
        (no_decay if quiet else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(step: int, total: int, warmup: int, floor: float = 0.01) -> float:
    """Learning-rate factor: linear warm-up to 1 over ``warmup`` steps, then cosine decay to ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A generator that depends on (seed, step, stream) only: the random data of one step, resumable."""
    state = np.random.SeedSequence([seed, step, stream]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def steps_per_epoch(num_examples: int, batch_size: int, what: str = "training examples") -> int:
    """Optimizer steps in one epoch of full (global) batches, the unit epoch-based configs convert with once; an
    error when the data is smaller than one batch."""
    if num_examples < batch_size:
        raise ValueError(f"{num_examples} {what} is fewer than one batch of {batch_size}")
    return num_examples // batch_size


@dataclass(frozen=True)
class TrainSpec:
    """How to optimise: every task fills this from its config (one set of names for every task)."""

    steps: int
    lr: float
    weight_decay: float
    warmup_steps: int = 0
    min_lr_ratio: float = 0.01  # the cosine decays to lr * min_lr_ratio
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 0.0  # max gradient norm; 0 = no clipping
    amp: bool = False  # bf16 autocast
    log_every: int = 10  # telemetry + one events.jsonl row every this many steps (and at the first and last)
    telemetry_queries: int | None = 64  # queries per layer the telemetry looks at (None = all)

    @classmethod
    def from_config(cls, config, steps_per_epoch: int = 0, **fields) -> "TrainSpec":
        """The spec of a task config (``quest_sdk.config.TrainingConfig``): the run's length in optimizer steps
        (``training_steps``: epochs are converted with ``steps_per_epoch``), its warm-up (``warmup_steps_for``, the
        one rule of every task), learning rate, weight decay, gradient clipping, autocast and logging interval;
        ``fields`` set the settings a config does not hold (``min_lr_ratio``, ``betas``, ``telemetry_queries``)."""
        steps = training_steps(config, steps_per_epoch)
        return cls(**{"steps": steps, "lr": config.lr, "weight_decay": config.weight_decay,
                      "warmup_steps": warmup_steps_for(config, steps, steps_per_epoch), "grad_clip": config.grad_clip,
                      "amp": config.amp, "log_every": config.log_every, **fields})

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"training needs at least 1 step, got steps={self.steps}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}")


def training_steps(config, steps_per_epoch: int = 0) -> int:
    """The optimizer steps of a run: the config's ``steps``, or its ``epochs`` times ``steps_per_epoch``."""
    if hasattr(config, "steps"):
        return int(config.steps)
    if not hasattr(config, "epochs"):
        raise ValueError(f"{type(config).__name__} declares neither steps nor epochs: the run's length is unknown")
    if not steps_per_epoch > 0:
        raise ValueError(f"a run of {config.epochs} epochs needs the steps per epoch (engine.steps_per_epoch), "
                         f"got {steps_per_epoch}")
    return config.epochs * steps_per_epoch


def warmup_steps_for(config, steps: int, steps_per_epoch: float = 0.0) -> int:
    """The warm-up of every task, in optimizer steps: the config's ``warmup_steps``, ``warmup_epochs`` (times
    ``steps_per_epoch``, rounded down) or ``warmup_frac`` (of ``steps``, at least 1). A warm-up longer than the run
    is refused when the config is built (``quest_sdk.config.check_warmup``), so none is clamped here. A config
    without a warm-up key has none."""
    if hasattr(config, "warmup_steps"):
        return int(config.warmup_steps)
    if hasattr(config, "warmup_epochs"):
        if not steps_per_epoch > 0:
            raise ValueError("a warm-up in epochs (warmup_epochs) needs the steps per epoch")
        return int(config.warmup_epochs * steps_per_epoch)
    if hasattr(config, "warmup_frac"):
        return max(1, int(config.warmup_frac * steps))
    return 0


class Watcher(Protocol):
    """Something that follows the training loss (e.g. a loss-spike counter); its state is checkpointed."""

    def update(self, step: int, loss: float) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


LossFn = Callable[[nn.Module, Any, torch.Generator], "torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]"]


class Trainer:
    """Trains ``model`` with ``spec``, reporting through the run context ``ctx`` (``quest_sdk.task.RunContext``)."""

    def __init__(self, model: nn.Module, ctx, spec: TrainSpec, desc: str, param_groups: list[dict] | None = None,
                 watchers: dict[str, Watcher] | None = None, log_extra: Callable[[], dict[str, float]] | None = None):
        self.model, self.ctx, self.spec, self.desc = model, ctx, spec, desc
        self.watchers, self.log_extra = watchers or {}, log_extra
        self.device = torch.device(ctx.device)
        self.optimizer = torch.optim.AdamW(param_groups or decay_groups(model, spec.weight_decay), lr=spec.lr,
                                           betas=spec.betas, fused=self.device.type == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: warmup_cosine(s, spec.steps, spec.warmup_steps, spec.min_lr_ratio))
        self.telemetry = Telemetry(model, max_queries=spec.telemetry_queries)
        self.step = 0  # optimizer steps taken
        self.resumed_from_step = 0

    # -- randomness and data ------------------------------------------------------------------------------------

    def rng(self, step: int, stream: int = 0) -> torch.Generator:
        """The generator of a step's data (``stream`` separates independent draws within a step)."""
        return step_generator(self.ctx.seed, step, stream)

    def shard(self, global_batch: int) -> slice:
        """This worker's rows of a global batch (all of them with one worker)."""
        world, rank = self.ctx.world_size, self.ctx.rank
        if global_batch % world:
            raise ValueError(f"the global batch of {global_batch} does not split over {world} workers")
        per = global_batch // world
        return slice(rank * per, (rank + 1) * per)

    def epoch_batches(self, num_examples: int, batch_size: int) -> "EpochBatches":
        """Shuffled index batches, a new permutation every epoch (``batch_size`` is the global batch)."""
        return EpochBatches(num_examples, batch_size, self.ctx.seed, self.shard(batch_size))

    # -- the loop -----------------------------------------------------------------------------------------------

    def fit(self, batches: Callable[[int], Iterable[Any]], loss_fn: LossFn) -> int:
        """Train to ``spec.steps``: ``batches(start)`` yields the batches of steps ``start, start + 1, ...``;
        ``loss_fn(model, batch, rng)`` returns the loss (or ``(loss, terms)``, terms logged beside it) under autocast;
        it must call ``model`` (the DDP wrapper when data-parallel: only its ``forward`` synchronises gradients).
        Returns the steps trained in this process (fewer than ``spec.steps`` after a resume)."""
        self.restore()
        start = self.step
        self.ctx.begin(start)
        train_model = self.ctx.wrap_model(self.model)
        train_model.train()
        every = self.ctx.checkpoint_every or max(1, self.spec.steps // 10)
        with self.ctx.bar(self.spec.steps, self.desc, initial=start) as bar:
            for batch in _limit(batches(start), self.spec.steps - start):
                logging = self.step % self.spec.log_every == 0 or self.step in (0, self.spec.steps - 1)
                with self.telemetry if logging else nullcontext(), \
                        torch.autocast(self.device.type, torch.bfloat16, enabled=self.spec.amp):
                    out = loss_fn(train_model, batch, self.rng(self.step, stream=1 + self.ctx.rank))
                    per_layer = self.telemetry.snapshot() if logging else {}
                loss, terms = out if isinstance(out, tuple) else (out, {})
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.grad_clip or math.inf)
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                self._report(loss.item(), per_layer, float(grad_norm), terms)
                bar.update(1)
                if self.step % every == 0 or self.step == self.spec.steps:
                    self.save()
        self.model.eval()
        return self.step - start

    def _report(self, loss: float, per_layer: dict, grad_norm: float, terms: dict) -> None:
        stats = summarize(per_layer) if per_layer else None
        self.ctx.check(self.step, loss, stats)
        for watcher in self.watchers.values():
            watcher.update(self.step, loss)
        if per_layer:
            layers = {f"{name}/{k}": v[k] for name, v in per_layer.items() for k in ("max_logit", "entropy_mean")}
            extra = self.log_extra() if self.log_extra else {}
            self.ctx.log(self.step, {"loss": loss, "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
                                     **{k: float(v.detach()) for k, v in terms.items()}, **extra, **stats, **layers})

    # -- checkpoints --------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        np_state = np.random.get_state()
        return {
            "version": CHECKPOINT_VERSION, "step": self.step,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "watchers": {name: w.state_dict() for name, w in self.watchers.items()},
            "telemetry_last": dict(self.ctx.telemetry_last),
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                    "python": random.getstate()},
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {state.get('version')} is not {CHECKPOINT_VERSION}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for name, watcher in self.watchers.items():
            watcher.load_state_dict(state["watchers"][name])
        self.ctx.telemetry_last = dict(state["telemetry_last"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        kind, keys, *rest = rng["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
        random.setstate(_as_tuples(rng["python"]))
        self.step = self.resumed_from_step = int(state["step"])

    def save(self) -> None:
        self.ctx.checkpoints.save(self.state_dict(), self.step)

    def restore(self) -> None:
        """Resume from the run's checkpoint, if any. One that does not fit (another architecture, optimizer or
        checkpoint version) is set aside by the checkpoint store and training starts over from this exact state."""
        state = self.ctx.checkpoints.load()
        if state is None:
            return
        fresh = copy.deepcopy(self.state_dict())  # loading may fail half-way: this is the state to start from
        try:
            self.load_state_dict(state)
        except Exception as err:
            self.load_state_dict(fresh)
            self.step = self.resumed_from_step = 0
            set_aside = getattr(self.ctx.checkpoints, "set_aside", None)
            if set_aside is None:
                raise
            set_aside(f"does not fit this run: {type(err).__name__}: {err}")
            return
        self.ctx.resumed_from_step = self.step


class EpochBatches:
    """Index batches of shuffled epochs: step s uses permutation ``s // per_epoch`` (drawn from (seed, epoch)
    alone), rows ``rows`` of its batch. Stateless, so it resumes at any step; usable as a DataLoader
    ``batch_sampler`` through ``from_step``."""

    def __init__(self, num_examples: int, batch_size: int, seed: int, rows: slice = slice(None)):
        self.per_epoch = steps_per_epoch(num_examples, batch_size)
        self.num_examples, self.batch_size, self.seed, self.rows = num_examples, batch_size, seed, rows
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def batch(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = torch.randperm(self.num_examples, generator=step_generator(self.seed, epoch, stream=2**20))
        return self._order[i * self.batch_size: (i + 1) * self.batch_size][self.rows]

    def from_step(self, start: int) -> Iterator[list[int]]:
        step = start
        while True:
            yield self.batch(step).tolist()
            step += 1


def rank_shard(count: int, rank: int, world_size: int) -> range:
    """This worker's contiguous share of ``count`` evaluation items (the first ``count % world_size`` workers take
    one more): every item is evaluated by exactly one worker."""
    per, extra = divmod(count, world_size)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))


def reduce_sums(values: list[float], ctx) -> list[float]:
    """Sums over the data-parallel workers (an all-reduce, in float64, that every worker must call), or the values
    themselves for one worker: how sharded evaluations add up their counts."""
    import torch.distributed as dist

    if ctx.world_size == 1 or not dist.is_initialized():
        return list(values)
    sums = torch.tensor(values, dtype=torch.float64, device=torch.device(ctx.device) if ctx.device != "cpu" else None)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums.cpu().tolist()


def _limit(iterable: Iterable, count: int) -> Iterator:
    for i, item in enumerate(iterable):
        if i >= count:
            return
        yield item


def _as_tuples(value):
    """Python's random state round-tripped through a checkpoint (lists back to the tuples it requires)."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
