"""A ``timeseries`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_timeseries.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quest_sdk.data import stratified_subset
from quest_sdk.engine import Trainer, TrainSpec, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput
from quest_timeseries.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_timeseries.data import Series, load
from quest_timeseries.model import SeriesTransformer
from quest_timeseries.task import TimeseriesConfig


def run(cfg: TimeseriesConfig, ctx) -> TaskOutput:
    torch.manual_seed(ctx.seed)
    device = torch.device(ctx.device)
    data = load(cfg.dataset, ctx.data_root, cfg.val_fraction)
    num_classes = len(data.classes)
    model = make_model(cfg, data.train.x.shape[2], num_classes, ctx.variant).to(device)
    steps = train(model, cfg, data.train, ctx)

    pred = predict(model, data.test, device)
    majority = int(torch.bincount(data.train.y, minlength=num_classes).argmax())  # ties: the first class
    metrics = {"test_acc": accuracy(pred, data.test.y),
               "val_acc": accuracy(predict(model, data.val, device), data.val.y),
               "mean_class_acc": mean_class_accuracy(pred, data.test.y, num_classes),
               "majority_acc": accuracy(torch.full_like(data.test.y, majority), data.test.y)}
    test = data.test.subset(stratified_subset(data.test.y, cfg.corruption_samples, seed=ctx.seed))
    metrics.update(corruption_summary(corruption_scores(
        dict.fromkeys(CORRUPTIONS, SEVERITIES),
        lambda name, s, seed: accuracy(predict(model, Series(*corrupt(test.x, test.observed, name, s, seed=seed),
                                                             test.y), device), test.y),
        ctx.seed)))
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data.revision},
                      samples_seen=steps * cfg.batch_size)


def make_model(cfg: TimeseriesConfig, channels: int, num_classes: int, variant: str) -> SeriesTransformer:
    return SeriesTransformer(channels, num_classes, variant, patch_len=cfg.patch_len, dim=cfg.dim, depth=cfg.depth,
                             num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, dropout=cfg.dropout)


def trim(x_btc: torch.Tensor, observed_bt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch cut after its last observed step (the padding beyond changes nothing, it only costs time)."""
    steps = observed_bt.any(0).nonzero()
    end = int(steps.max()) + 1 if len(steps) else 1
    return x_btc[:, :end], observed_bt[:, :end]


def random_crop(x_btc: torch.Tensor, observed_bt: torch.Tensor, gen: torch.Generator, low: float = 0.8
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each series' window of a random 80-100 % of its steps up to its last observed one, moved to time 0."""
    b, t, c = x_btc.shape
    length = observed_bt.flip(1).to(torch.int64).argmax(1).neg() + t  # last observed step + 1
    keep = (length * (low + (1 - low) * torch.rand(b, generator=gen))).ceil().long().clamp(1)
    start = (torch.rand(b, generator=gen) * (length - keep + 1)).floor().long()
    idx_bt = (start[:, None] + torch.arange(t)).clamp(max=t - 1)
    inside = torch.arange(t) < keep[:, None]
    observed = torch.gather(observed_bt, 1, idx_bt) & inside
    x = torch.gather(x_btc, 1, idx_bt[..., None].expand(-1, -1, c)) * observed[..., None]
    empty = ~observed.any(1)  # a window inside a gap of missing steps: the series uncropped
    return torch.where(empty[:, None, None], x_btc, x), torch.where(empty[:, None], observed_bt, observed)


def train(model: SeriesTransformer, cfg: TimeseriesConfig, data: Series, ctx) -> int:
    """The shared engine: shuffled epochs, optional random crops (from the step's generator), label smoothing;
    returns the number of steps."""
    per_epoch = steps_per_epoch(len(data), cfg.batch_size, "training series")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, f"timeseries/{cfg.dataset}")

    def loss_fn(net, idx, rng):
        x, observed = data.x[idx], data.observed[idx]
        if cfg.augment:
            x, observed = random_crop(x, observed, rng)
        x, observed = trim(x, observed)
        logits = net(x.to(trainer.device), observed.to(trainer.device))
        return F.cross_entropy(logits.float(), data.y[idx].to(trainer.device), label_smoothing=cfg.label_smoothing)

    trainer.fit(trainer.epoch_batches(len(data), cfg.batch_size).from_step, loss_fn)
    return steps


@torch.no_grad()
def predict(model: SeriesTransformer, data: Series, device, batch_size: int = 64) -> torch.Tensor:
    model.eval()
    out = []
    for i in range(0, len(data), batch_size):
        x, observed = trim(data.x[i: i + batch_size], data.observed[i: i + batch_size])
        out.append(model(x.to(device), observed.to(device)).argmax(-1).cpu())
    return torch.cat(out)


def accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    return (pred == target).float().mean().item()


def mean_class_accuracy(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> float:
    """The mean over classes present in ``target`` of the per-class recall."""
    recalls = [(pred[target == c] == c).float().mean().item() for c in range(num_classes) if (target == c).any()]
    return sum(recalls) / len(recalls)
