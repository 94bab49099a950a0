"""A ``points`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_points.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quest_sdk.data import stratified_subset, validation_split
from quest_sdk.engine import Trainer, TrainSpec, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput
from quest_points.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_points.data import load
from quest_points.model import build_model
from quest_points.task import PointsConfig


def run(cfg: PointsConfig, ctx) -> TaskOutput:
    torch.manual_seed(ctx.seed)
    device = torch.device(ctx.device)
    data = load(cfg.dataset, ctx.data_root, cfg.sample_points, cfg.scanobjectnn_split)
    points = cfg.global_points if cfg.model == "global" else cfg.local_points
    model = make_model(cfg, len(data.classes), ctx.variant).to(device)
    fit, val = validation_split(data.train_y, cfg.val_fraction)
    steps = train(model, cfg, points, data.train_x[fit], data.train_y[fit], ctx)

    test_x = subsample(data.test_x, points, torch.Generator().manual_seed(10_000 + ctx.seed))
    pred = predict(model, test_x, device)
    metrics = {"test_acc": (pred == data.test_y).float().mean().item(),
               "mean_class_acc": mean_class_accuracy(pred, data.test_y, len(data.classes))}
    if len(val):
        val_x = subsample(data.train_x[val], points, torch.Generator().manual_seed(20_000 + ctx.seed))
        metrics["val_acc"] = (predict(model, val_x, device) == data.train_y[val]).float().mean().item()
    keep = stratified_subset(data.test_y, cfg.corruption_samples, seed=ctx.seed)  # every class, not the first ones
    x_c, y_c = test_x[keep], data.test_y[keep]
    metrics.update(corruption_summary(corruption_scores(
        dict.fromkeys(CORRUPTIONS, SEVERITIES),
        lambda name, s, seed: (predict(model, corrupt(x_c, name, s, seed=seed), device) == y_c).float().mean().item(),
        ctx.seed)))
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


def train(model, cfg: PointsConfig, points: int, x: torch.Tensor, y: torch.Tensor, ctx) -> int:
    """The shared engine: shuffled epochs, a random subset of ``points`` points per cloud and scale/shift
    augmentation (from the step's generator), label smoothing; returns the number of steps."""
    per_epoch = steps_per_epoch(len(x), cfg.batch_size, "training clouds")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, f"points/{cfg.model}")

    def loss_fn(net, idx, rng):
        clouds = subsample(x[idx], points, rng)
        if cfg.augment:
            clouds = augment(clouds, rng)
        pos, batch = as_graph(clouds, trainer.device)
        return F.cross_entropy(net(pos, batch), y[idx].to(trainer.device), label_smoothing=cfg.label_smoothing)

    trainer.fit(trainer.epoch_batches(len(x), cfg.batch_size).from_step, loss_fn)
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
