"""A ``spurious`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_spurious.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quest_sdk.engine import Trainer, TrainSpec
from quest_sdk.task import TaskOutput
from quest_spurious.model import ProbeModel
from quest_spurious.task import SpuriousConfig


def run(cfg: SpuriousConfig, ctx) -> TaskOutput:
    torch.set_num_threads(1)
    device = torch.device(ctx.device)
    data = cfg.data()
    model = ProbeModel(ctx.variant, cfg.key_dim, cfg.num_values, cfg.head_dim, cfg.hidden, cfg.initial_query_norm,
                       linear_keys=cfg.design == "norm")
    model = model.to(device)
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    unbiased = [t.to(device) for t in data.sample(cfg.eval_samples, eval_gen, biased=False)]
    biased = [t.to(device) for t in data.sample(cfg.eval_samples, eval_gen, biased=True)]
    probe = [t[:256] for t in biased]  # fixed biased batch for the key-norm curve

    trainer = Trainer(model, ctx, TrainSpec.from_config(cfg, min_lr_ratio=0.0, telemetry_queries=None),
                      "spurious", param_groups=param_groups(model, cfg),
                      log_extra=lambda: answer_key_norms(model, probe))
    rows = trainer.shard(cfg.batch_size)

    def batches(start: int):  # a fresh sample every step, drawn from the step's generator
        for step in range(start, cfg.steps):
            yield [t[rows] for t in data.sample(cfg.batch_size, trainer.rng(step))]

    def loss_fn(net, batch, rng):
        x_k, x_v, label = (t.to(device) for t in batch[:3])
        return F.cross_entropy(net(x_k, x_v), label)

    trainer.fit(batches, loss_fn)

    unbiased_acc = accuracy(model, unbiased)
    floor = data.uniform_accuracy(unbiased[1], unbiased[2])
    bayes = data.bayes_accuracy(unbiased[0], unbiased[1], unbiased[2])
    threshold = floor + cfg.success_fraction * (bayes - floor)
    fraction = (unbiased_acc - floor) / (bayes - floor)
    metrics = {
        "robust_success": float(unbiased_acc >= threshold),
        "robust_success_75": float(fraction >= 0.75),
        "robust_success_90": float(fraction >= 0.9),
        "robust_fraction": fraction,
        "unbiased_acc": unbiased_acc,
        "biased_acc": accuracy(model, biased),
        "bayes_unbiased_acc": bayes,
        "uniform_unbiased_acc": floor,
        "success_threshold": threshold,
        **{f"final_{k}": v for k, v in answer_key_norms(model, probe).items()},
        "query_norm": model.query.norm().item(),
    }
    return TaskOutput(metrics, data={"name": "spurious-synthetic", "revision": repr(data)},
                      samples_seen=cfg.steps * cfg.batch_size)


EVAL_SEED = 12345  # one held-out set for every run, so runs are compared on the same samples


def param_groups(model: ProbeModel, cfg: SpuriousConfig) -> list[dict]:
    """AdamW groups; the query and the qknorm scales decay only if ``decay_query_and_scales`` (a choice the paper
    leaves open)."""
    special = {id(model.query), *(id(p) for p in model.kernel.parameters())}
    decay = [p for p in model.parameters() if id(p) not in special]
    other = [p for p in model.parameters() if id(p) in special]
    return [{"params": decay, "weight_decay": cfg.weight_decay},
            {"params": other, "weight_decay": cfg.weight_decay if cfg.decay_query_and_scales else 0.0}]


@torch.no_grad()
def accuracy(model: ProbeModel, batch) -> float:
    x_k, x_v, label = batch[:3]
    return (model(x_k, x_v).argmax(-1) == label).float().mean().item()


@torch.no_grad()
def answer_key_norms(model: ProbeModel, probe) -> dict[str, float]:
    """Mean raw key norm of biased answer tokens vs the other tokens (the paper's lazy-solution mechanism)."""
    x_k, _, _, pos, _ = probe
    norms = model.keys(x_k).norm(dim=-1)  # (B, N)
    answer = torch.zeros_like(norms, dtype=torch.bool)
    answer[torch.arange(len(pos)), pos] = True
    return {"biased_answer_key_norm": norms[answer].mean().item(), "other_key_norm": norms[~answer].mean().item()}
