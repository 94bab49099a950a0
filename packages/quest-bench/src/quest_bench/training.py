"""Training helpers every task shares, so that every variant is optimised the same way in every domain."""

from __future__ import annotations

import math

import torch
from torch import nn

from quest_core import no_weight_decay, summarize


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


def adamw_warmup_cosine(model: nn.Module, lr: float, weight_decay: float, steps: int, warmup: int):
    """AdamW over ``decay_groups`` with a per-step ``warmup_cosine`` schedule: (optimizer, scheduler)."""
    optimizer = torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, steps, warmup))


def report_step(ctx, bar, step: int, loss: float, per_layer: dict, lr: float, extra: dict | None = None) -> None:
    """After an optimizer step: the divergence check (``ctx.check``) and, on steps where telemetry was taken
    (``per_layer`` non-empty), one row of events.jsonl with loss, learning rate, ``extra`` (task-specific values,
    e.g. loss terms) and the telemetry summary."""
    stats = summarize(per_layer) if per_layer else None
    ctx.check(step, loss, stats)
    if per_layer:
        ctx.log(step, {"loss": loss, "lr": lr, **(extra or {}), **stats})
        bar.set_postfix(loss=f"{loss:.2f}", refresh=False)
    bar.update(1)
