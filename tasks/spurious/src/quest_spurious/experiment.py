"""A ``spurious`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_spurious.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from quest_sdk.task import TaskOutput
from quest_core import Telemetry, summarize
from quest_spurious.model import ProbeModel
from quest_spurious.task import SpuriousConfig


def run(cfg: SpuriousConfig, ctx) -> TaskOutput:
    torch.set_num_threads(1)
    device = torch.device(ctx.device)
    data = cfg.data()
    train_gen = torch.Generator().manual_seed(ctx.seed)
    model = ProbeModel(ctx.variant, cfg.key_dim, cfg.num_values, cfg.head_dim, cfg.hidden, cfg.query_init_norm)
    model = model.to(device)
    optimizer = make_optimizer(model, cfg)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, cosine decay
        optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps))
    )
    eval_gen = torch.Generator().manual_seed(EVAL_SEED)
    unbiased = [t.to(device) for t in data.sample(cfg.eval_samples, eval_gen, biased=False)]
    biased = [t.to(device) for t in data.sample(cfg.eval_samples, eval_gen, biased=True)]
    probe = [t[:256] for t in biased]  # fixed biased batch for the key-norm curve

    with Telemetry(model, max_queries=None) as tel, ctx.bar(cfg.steps, "spurious") as bar:
        for step in range(cfg.steps):
            x_k, x_v, label, _, _ = (t.to(device) for t in data.sample(cfg.batch_size, train_gen))
            loss = F.cross_entropy(model(x_k, x_v), label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            stats = summarize(tel.snapshot())
            ctx.check(step, loss.item(), stats)
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                ctx.log(step, {"loss": loss.item(), **answer_key_norms(model, probe), **stats})
            bar.update(1)
    tel_final = ctx.telemetry_last

    unbiased_acc = accuracy(model, unbiased)
    floor = data.uniform_accuracy(unbiased[1], unbiased[2])
    bayes = data.bayes_accuracy(unbiased[0], unbiased[1], unbiased[2])
    threshold = floor + cfg.success_fraction * (bayes - floor)
    metrics = {
        "robust_success": float(unbiased_acc >= threshold),
        "robust_fraction": (unbiased_acc - floor) / (bayes - floor),
        "unbiased_acc": unbiased_acc,
        "biased_acc": accuracy(model, biased),
        "bayes_unbiased_acc": bayes,
        "uniform_unbiased_acc": floor,
        "success_threshold": threshold,
        **{f"final_{k}": v for k, v in answer_key_norms(model, probe).items()},
        "final_max_logit": tel_final.get("max_logit", float("nan")),
        "query_norm": model.query.norm().item(),
    }
    return TaskOutput(metrics, data={"name": "spurious-synthetic", "revision": repr(data)},
                      samples_seen=cfg.steps * cfg.batch_size)


EVAL_SEED = 12345  # one held-out set for every run, so runs are compared on the same samples


def make_optimizer(model: ProbeModel, cfg: SpuriousConfig) -> torch.optim.Optimizer:
    """AdamW; the query and the qknorm scales decay only if ``decay_query_and_scales`` (a choice the paper leaves open)."""
    special = {id(model.query), *(id(p) for p in model.kernel.parameters())}
    decay = [p for p in model.parameters() if id(p) not in special]
    other = [p for p in model.parameters() if id(p) in special]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": other, "weight_decay": cfg.weight_decay if cfg.decay_query_and_scales else 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr)


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
