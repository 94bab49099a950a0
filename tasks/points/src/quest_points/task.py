"""quest-bench task ``points``: point-cloud shape classification with a dot-product point transformer
(``model=global``: Point-MAE-style tokens + transformer; ``model=local``: kNN-graph attention, hierarchical) whose
attention is a quest-core variant; clean overall and mean-class accuracy, ModelNet-C corruptions (mCE in the
leaderboard), attention telemetry."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quest_bench.robustness import corruption_summary
from quest_bench.config import param
from quest_bench.task import Resources, Task, TaskOutput
from quest_bench.training import adamw_warmup_cosine, report_step
from quest_core import Telemetry
from quest_points.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_points.data import load
from quest_points.model import build_model


@dataclass
class PointsConfig:
    dataset: str = param("kicad", choices=("kicad", "modelnet10", "modelnet40", "scanobjectnn"))  # kicad ships; the
    # others are read from --data-root
    scanobjectnn_split: str = param("", choices=("", "_augmentedrot_scale75"))  # "" = OBJ_ONLY, or PB_T50_RS
    model: str = param("global", choices=("global", "local"))  # global (Point-MAE-style) | local (kNN-graph
    # attention, hierarchical)
    sample_points: int = param(1024, ge=1)  # ModelNet: surface points sampled per mesh (the shipped shapes have 1,024)
    global_points: int = param(512, ge=1)  # points per cloud for the global model: a random subset each training
    # step, a fixed seeded one for evaluation
    local_points: int = param(256, ge=1)  # the same for the local model (which costs ~4x more per point)
    groups: int = param(32, ge=1)  # global: FPS centres (tokens)
    group_size: int = param(16, ge=1)  # global: kNN points per group
    point_width: int = param(64, ge=1)  # global: width of the per-group PointNet
    dim: int = param(96, ge=1)  # global: transformer width
    depth: int = param(3, ge=1)  # global: transformer blocks
    num_heads: int = param(4, ge=1)
    local_dims: str = param("32,64,128", items=int, ge=1)  # local: widths of the stages (FPS to 1/4 between stages)
    k: int = param(8, ge=1)  # local: neighbours per point
    epochs: int = param(25, ge=1)
    batch_size: int = param(32, ge=1)
    lr: float = param(1e-3, gt=0)  # AdamW peak, 1 warm-up epoch then cosine to 1 %
    weight_decay: float = param(0.05, ge=0)  # on weight matrices only (quest_bench.training.decay_groups)
    warmup_epochs: float = param(1.0, ge=0)
    label_smoothing: float = param(0.1, ge=0, lt=1)
    augment: bool = True  # random anisotropic scale in [2/3, 3/2] and shift in [-0.2, 0.2] per cloud
    amp: bool = False  # bfloat16 autocast (CUDA)
    corruption_samples: int = param(0, ge=0)  # test clouds per (corruption, severity); 0 = all
    log_every: int = param(10, ge=1)

    def __post_init__(self):
        if not self.local_dims.strip():
            raise ValueError("local_dims needs at least one stage width")
        if self.model == "global" and self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")
        if self.model == "global" and self.group_size > self.global_points:
            raise ValueError(f"group_size ({self.group_size}) must be <= global_points ({self.global_points})")


class PointsTask(Task):
    name = "points"
    version = "1"
    primary_metric = "test_acc"
    higher_is_better = True
    leaderboard_metrics = {"mean_class_acc": True, "corrupted_acc": True}
    config_class = PointsConfig
    presets = {
        "tiny": {},
        "small": {"global_points": 1024, "local_points": 1024, "k": 16, "groups": 64, "group_size": 32,
                  "point_width": 128, "dim": 192, "depth": 6, "epochs": 60},
        "paper": {  # Point-BERT/Point-MAE's transformer trained from scratch on ModelNet40 (Yu et al. 2022)
            "dataset": "modelnet40", "global_points": 1024, "local_points": 1024, "k": 16, "groups": 64,
            "group_size": 32, "point_width": 256, "dim": 384, "depth": 12, "num_heads": 6, "epochs": 300,
            "batch_size": 32, "lr": 5e-4, "weight_decay": 0.05, "warmup_epochs": 10, "amp": True, "log_every": 50,
        },
    }
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
                 "paper": Resources(num_cpus=8, num_gpus=1)}

    def run(self, cfg: PointsConfig, ctx) -> TaskOutput:
        torch.manual_seed(ctx.seed)
        device = torch.device(ctx.device)
        data = load(cfg.dataset, ctx.data_root, cfg.sample_points, cfg.scanobjectnn_split)
        points = cfg.global_points if cfg.model == "global" else cfg.local_points
        model = make_model(cfg, len(data.classes), ctx.variant).to(device)
        steps = train(model, cfg, points, data.train_x, data.train_y, ctx, device)

        test_x = subsample(data.test_x, points, torch.Generator().manual_seed(10_000 + ctx.seed))
        pred = predict(model, test_x, device)
        metrics = {"test_acc": (pred == data.test_y).float().mean().item(),
                   "mean_class_acc": mean_class_accuracy(pred, data.test_y, len(data.classes))}
        keep = torch.arange(len(test_x))  # the test set is sorted by class: subsample at random, not the first n
        if cfg.corruption_samples and cfg.corruption_samples < len(test_x):
            keep = torch.randperm(len(test_x), generator=torch.Generator().manual_seed(ctx.seed))[:cfg.corruption_samples]
        x_c, y_c = test_x[keep], data.test_y[keep]
        metrics.update(corruption_summary({
            name: [(predict(model, corrupt(x_c, name, s, seed=ctx.seed * 1000 + 10 * i + s), device) == y_c)
                   .float().mean().item() for s in SEVERITIES]
            for i, name in enumerate(CORRUPTIONS)
        }))
        metrics.update({f"final_{k}": v for k, v in ctx.telemetry_last.items()})
        return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data.revision},
                          samples_seen=steps * cfg.batch_size)


def make_model(cfg: PointsConfig, num_classes: int, variant: str) -> torch.nn.Module:
    if cfg.model == "global":
        return build_model("global", num_classes, variant, groups=cfg.groups, group_size=cfg.group_size,
                           dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, point_width=cfg.point_width)
    dims = tuple(int(d) for d in cfg.local_dims.split(","))
    return build_model(cfg.model, num_classes, variant, dims=dims, num_heads=cfg.num_heads, k=cfg.k)


def as_graph(x_bp3: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense clouds (B, P, 3) as torch-geometric's flat ``pos`` (B*P, 3) and ``batch`` (B*P,)."""
    b, p, _ = x_bp3.shape
    return x_bp3.reshape(-1, 3).to(device), torch.arange(b, device=device).repeat_interleave(p)


def subsample(x_bn3: torch.Tensor, num_points: int, gen: torch.Generator) -> torch.Tensor:
    """A random subset of ``num_points`` points of each cloud (all of them if it has no more)."""
    if x_bn3.shape[1] <= num_points:
        return x_bn3
    idx = torch.rand(x_bn3.shape[:2], generator=gen).argsort(1)[:, :num_points]
    return torch.gather(x_bn3, 1, idx[..., None].expand(-1, -1, 3))


def augment(x_bp3: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    scale = 2 / 3 + (3 / 2 - 2 / 3) * torch.rand((x_bp3.shape[0], 1, 3), generator=gen)
    shift = 0.4 * torch.rand((x_bp3.shape[0], 1, 3), generator=gen) - 0.2
    return x_bp3 * scale + shift


def train(model, cfg: PointsConfig, points: int, x: torch.Tensor, y: torch.Tensor, ctx, device) -> int:
    """AdamW with warm-up + cosine, label smoothing, scale/shift augmentation; returns the number of steps."""
    gen = torch.Generator().manual_seed(ctx.seed)
    per_epoch = len(x) // cfg.batch_size
    if per_epoch == 0:
        raise ValueError(f"{len(x)} training clouds is fewer than one batch of {cfg.batch_size}")
    steps = cfg.epochs * per_epoch
    optimizer, scheduler = adamw_warmup_cosine(model, cfg.lr, cfg.weight_decay, steps,
                                               int(cfg.warmup_epochs * per_epoch))
    telemetry = Telemetry(model, max_queries=64)
    step = 0
    model.train()
    with ctx.bar(steps, f"points/{cfg.model}") as bar:
        for _ in range(cfg.epochs):
            order = torch.randperm(len(x), generator=gen)
            for i in range(per_epoch):
                idx = order[i * cfg.batch_size: (i + 1) * cfg.batch_size]
                clouds = subsample(x[idx], points, gen)
                if cfg.augment:
                    clouds = augment(clouds, gen)
                pos, batch = as_graph(clouds, device)
                logging = step % cfg.log_every == 0 or step == steps - 1
                with telemetry if logging else nullcontext(), torch.autocast(device.type, torch.bfloat16, enabled=cfg.amp):
                    loss = F.cross_entropy(model(pos, batch), y[idx].to(device), label_smoothing=cfg.label_smoothing)
                    per_layer = telemetry.snapshot() if logging else {}
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                report_step(ctx, bar, step, loss.item(), per_layer, optimizer.param_groups[0]["lr"])
    model.eval()
    return steps


@torch.no_grad()
def predict(model, x_bn3: torch.Tensor, device, batch_size: int = 64) -> torch.Tensor:
    model.eval()
    out = []
    for i in range(0, len(x_bn3), batch_size):
        pos, batch = as_graph(x_bn3[i: i + batch_size], device)
        out.append(model(pos, batch).argmax(-1).cpu())
    return torch.cat(out)


def mean_class_accuracy(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> float:
    """The mean over classes present in ``target`` of the per-class recall."""
    recalls = [(pred[target == c] == c).float().mean().item() for c in range(num_classes) if (target == c).any()]
    return sum(recalls) / len(recalls)
