"""quest-bench task ``spurious``: does a variant learn the robust signal or the shortcut?

Trains ProbeModel on the mixed (50% biased) distribution and evaluates on held-out unbiased and biased samples.
A run "learned the robust solution" when its unbiased accuracy is at least halfway (``success_fraction`` = 0.5)
from the floor to the ceiling of the same held-out set: the floor is a reader that ignores x^k (uniform attention,
which is what the shortcut alone gives on unbiased samples, where b never occurs); the ceiling is the Bayes-optimal
reader of the covariance signal. ``robust_fraction`` is the same position as a number (0 = floor, 1 = ceiling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quest_bench.config import param
from quest_bench.task import Resources, Task, TaskOutput
from quest_core import Telemetry, summarize
from quest_spurious.data import ProbeData
from quest_spurious.model import ProbeModel

EVAL_SEED = 12345  # one held-out set for every run, so runs are compared on the same samples


@dataclass
class SpuriousConfig:
    seq_len: int = param(16, ge=2)  # N tokens per sample
    key_dim: int = param(8, ge=1)  # dimension of x^k
    num_values: int = param(8, ge=2)  # C, number of one-hot values (chance = 1/C)
    signal_dims: int = param(4, ge=0)  # how many dims of the unbiased answer token have variance signal_var
    signal_var: float = param(2.0, gt=0)  # Σ = diag(signal_var × signal_dims, 1 × rest)
    bias_norm: float = param(3.0, ge=0)  # ‖b‖ of the shared shortcut mean
    bias_var: float = param(0.1, gt=0)  # biased answer tokens ~ N(b, bias_var · I)
    p_biased: float = param(0.5, ge=0, le=1)  # fraction of biased training samples
    data_seed: int = param(0, ge=0)  # fixes b (shared by all runs)
    head_dim: int = param(16, ge=1)
    hidden: int = param(32, ge=1)
    query_init_norm: float = param(1.0, gt=0)  # ‖q‖ at init: QUEST's (and softmax's) initial inverse temperature
    steps: int = param(1500, ge=1)
    batch_size: int = param(128, ge=1)
    lr: float = param(3e-3, gt=0)
    weight_decay: float = param(0.0, ge=0)
    decay_query_and_scales: bool = True  # apply weight decay to the query (QUEST's temperature) and qknorm scales
    warmup_steps: int = param(50, ge=0)
    eval_samples: int = param(4000, ge=1)
    log_every: int = param(25, ge=1)
    success_fraction: float = param(0.5, ge=0, le=1)  # success: unbiased acc >= floor + success_fraction · (bayes - floor)

    def __post_init__(self):
        if self.signal_dims > self.key_dim:
            raise ValueError(f"signal_dims ({self.signal_dims}) must be <= key_dim ({self.key_dim})")

    def data(self) -> ProbeData:
        return ProbeData(self.seq_len, self.key_dim, self.num_values, self.signal_dims, self.signal_var,
                         self.bias_norm, self.bias_var, self.p_biased, self.data_seed)


class SpuriousTask(Task):
    name = "spurious"
    version = "2"
    primary_metric = "robust_success"
    higher_is_better = True
    leaderboard_metrics = {"robust_fraction": True, "unbiased_acc": True, "biased_acc": True}
    config_class = SpuriousConfig
    presets = {"tiny": {}, "small": {"steps": 3000}, "paper": {"steps": 6000, "seq_len": 32}}
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=1), "paper": Resources(num_cpus=1)}

    def run(self, cfg: SpuriousConfig, ctx) -> TaskOutput:
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
