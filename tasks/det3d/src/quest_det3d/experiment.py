"""A ``det3d`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_det3d.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from quest_sdk.engine import Trainer, TrainSpec, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput
from quest_det3d import data as D
from quest_det3d.boxes import decode, encode, focal_loss, regression_loss
from quest_det3d.corruptions import CORRUPTIONS, corrupt
from quest_det3d.evaluation import detection_config, evaluate, submission
from quest_det3d.figures import prediction_figure
from quest_det3d.model import Detector
from quest_det3d.task import Det3dConfig


def run(cfg: Det3dConfig, ctx) -> TaskOutput:
    if cfg.dataset not in DATASETS:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; valid: {', '.join(DATASETS)}")
    severities = [int(s) for s in cfg.severities.split(",") if s.strip()]  # checked by the config's declared range
    torch.manual_seed(ctx.seed)
    device = torch.device(ctx.device)
    version, classes = DATASETS[cfg.dataset]
    if cfg.dataset == "sim":
        root = D.simulated_root(cfg.sim_samples, cfg.sim_between)
    elif not ctx.data_root:
        raise ValueError(f"dataset {cfg.dataset!r} reads the real nuScenes: pass --data-root")
    else:
        root = D.nuscenes_root(ctx.data_root, version, cfg.sweeps)
    nusc = D.open_nuscenes(root, version)
    train_split, val_split = D.SPLITS[version]
    tune_split = None
    if cfg.tune_split:
        train_split, tune_split = D.TUNING_SPLITS[version]
    reach = cfg.extent * (1.45 if cfg.augment else 1.0)  # rotation and scaling bring points from outside the grid in
    train_set = D.load_split(nusc, train_split, classes, cfg.sweeps, reach, cfg.in_memory, ctx.progress)
    val_set = D.load_split(nusc, val_split, classes, cfg.sweeps, cfg.extent, cfg.in_memory, ctx.progress)

    model = Detector(len(classes), ctx.variant, cfg.sweeps, cfg.extent, cfg.pillar, cfg.pillar_width, cfg.width,
                     cfg.dim, cfg.depth, cfg.num_heads).to(device)
    steps = train(model, cfg, train_set, len(classes), ctx)

    # The devkit measures range from the ego origin, the grid is centred on the LiDAR (0.94 m ahead on nuScenes).
    eval_cfg = detection_config(classes, cfg.extent - math.hypot(*val_set[0].lidar_to_ego["translation"][:2]))
    detections = predict(model, val_set, cfg, device)
    metrics = evaluate(nusc, val_split, submission(val_set, detections, classes), eval_cfg,
                       ctx.out_dir / "nuscenes_eval")
    if tune_split:
        tune_set = D.load_split(nusc, tune_split, classes, cfg.sweeps, cfg.extent, cfg.in_memory, ctx.progress)
        tuned = evaluate(nusc, tune_split, submission(tune_set, predict(model, tune_set, cfg, device), classes),
                         eval_cfg, ctx.out_dir / "nuscenes_eval_tune")
        metrics.update(val_nds=tuned["NDS"], val_map=tuned["mAP"])
    if cfg.figure_samples:
        prediction_figure(val_set, detections, classes, cfg.extent, Path(ctx.out_dir) / "predictions.png",
                          f"det3d {ctx.variant} seed {ctx.seed}: {val_split}", count=cfg.figure_samples)
    if severities:
        with tempfile.TemporaryDirectory() as tmp, ctx.bar(len(CORRUPTIONS) * len(severities), "det3d: corrupted") as bar:

            def corrupted_nds(name: str, severity: int, seed: int) -> float:
                corrupted = corrupt_set(val_set, name, severity, seed)
                detections = predict(model, corrupted, cfg, device)
                bar.update(1)
                return evaluate(nusc, val_split, submission(corrupted, detections, classes), eval_cfg,
                                Path(tmp) / f"{name}-{severity}")["NDS"]

            nds = corruption_scores(dict.fromkeys(CORRUPTIONS, severities), corrupted_nds, ctx.seed)
        metrics.update(corruption_summary(nds, score="nds"))
    return TaskOutput(metrics, data={"name": f"{cfg.dataset} ({version})", "revision": data_revision(cfg, root)},
                      samples_seen=steps * cfg.batch_size)


NUSCENES_CLASSES = ("car", "truck", "construction_vehicle", "bus", "trailer", "barrier", "motorcycle", "bicycle",
                    "pedestrian", "traffic_cone")


DATASETS = {  # name -> (nuScenes version, classes)
    "sim": ("v1.0-mini", D.SIM_CLASSES),
    "nuscenes-mini": ("v1.0-mini", NUSCENES_CLASSES),
    "nuscenes": ("v1.0-trainval", NUSCENES_CLASSES),
}


def data_revision(cfg: Det3dConfig, root: Path) -> str:
    if cfg.dataset == "sim":
        return f"sim-v{D.SIM_VERSION}-{cfg.sim_samples}x{cfg.sim_between}"
    return f"{root.resolve()}"


def corrupt_set(samples: list[D.Sample], name: str, severity: int, seed: int) -> list[D.Sample]:
    """The samples with their clouds corrupted when read (sample i uses seed + 7919 * i); boxes and poses unchanged."""
    return [dataclasses.replace(s, source=functools.partial(corrupted_cloud, s, name, severity, seed + 7919 * i))
            for i, s in enumerate(samples)]


def corrupted_cloud(sample: D.Sample, name: str, severity: int, seed: int) -> np.ndarray:
    from pyquaternion import Quaternion

    forward = Quaternion(sample.lidar_to_ego["rotation"]).inverse.rotate([1.0, 0.0, 0.0])[:2]  # ego x in LiDAR frame
    return corrupt(sample.points, name, severity, seed, forward)


def as_tensors(samples: list[D.Sample]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The DataLoader's collate function: each sample's (points, boxes, labels), read in the worker."""
    return [(torch.from_numpy(s.points), torch.from_numpy(s.boxes), torch.from_numpy(s.labels)) for s in samples]


def batches(samples: list[D.Sample], cfg: "Det3dConfig", batch_sampler=None):
    """Batches (lists) of (points, boxes, labels) tensors: of ``batch_sampler``'s index lists, or in order over all
    samples; ``cfg.workers`` processes read the clouds. A fixed generator: the loader never draws from the global
    random state (which a checkpoint restores)."""
    order = dict(batch_sampler=batch_sampler) if batch_sampler is not None else dict(batch_size=cfg.batch_size)
    return torch.utils.data.DataLoader(samples, num_workers=cfg.workers, collate_fn=as_tensors,
                                       generator=torch.Generator().manual_seed(0), **order)


def augment(points: torch.Tensor, boxes: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random flips about both axes, a rotation within +-pi/8 and a scaling within 0.95-1.05 of a cloud and its boxes
    (x, y, z, w, l, h, yaw, vx, vy)."""
    points, boxes = points.clone(), boxes.clone()
    if torch.rand((), generator=gen) < 0.5:  # y -> -y
        points[:, 1], boxes[:, 1], boxes[:, 6], boxes[:, 8] = -points[:, 1], -boxes[:, 1], -boxes[:, 6], -boxes[:, 8]
    if torch.rand((), generator=gen) < 0.5:  # x -> -x
        points[:, 0], boxes[:, 0], boxes[:, 7] = -points[:, 0], -boxes[:, 0], -boxes[:, 7]
        boxes[:, 6] = math.pi - boxes[:, 6]
    angle = (torch.rand((), generator=gen) * 2 - 1) * math.pi / 8
    c, s = torch.cos(angle), torch.sin(angle)
    rotation = torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
    points[:, :2] = points[:, :2] @ rotation.T
    boxes[:, :2] = boxes[:, :2] @ rotation.T
    boxes[:, 7:9] = boxes[:, 7:9] @ rotation.T
    boxes[:, 6] += angle
    scale = 0.95 + 0.1 * torch.rand((), generator=gen)
    points[:, :3] *= scale
    boxes[:, :6] *= scale
    boxes[:, 7:9] *= scale
    return points, boxes


def train(model: Detector, cfg: Det3dConfig, samples: list[D.Sample], num_classes: int, ctx) -> int:
    """The shared engine with gradient clipping, shuffled epochs, flip/rotate/scale augmentation from the step's
    generator, CenterPoint losses (focal heatmap + 0.25 x weighted L1 code); returns the steps."""
    per_epoch = steps_per_epoch(len(samples), cfg.batch_size, "training samples")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, "det3d")
    sampler = trainer.epoch_batches(len(samples), cfg.batch_size)
    grid = model.grid  # the target geometry; the network itself is only called through loss_fn's ``net``

    def loss_fn(net, batch, rng):
        if cfg.augment:
            batch = [(*augment(points, boxes, rng), labels) for points, boxes, labels in batch]
        targets = encode([b for _, b, _ in batch], [lab for _, _, lab in batch], num_classes, grid).to(trainer.device)
        heat, code = net([p.to(trainer.device) for p, _, _ in batch])
        heat_loss, code_loss = focal_loss(heat, targets.heatmap), regression_loss(code, targets, cfg.velocity_weight)
        return heat_loss + 0.25 * code_loss, {"heatmap_loss": heat_loss, "code_loss": code_loss}

    trainer.fit(lambda start: batches(samples, cfg, sampler.from_step(start)), loss_fn)
    return steps


@torch.no_grad()
def predict(model: Detector, samples: list[D.Sample], cfg: Det3dConfig, device) -> list[tuple]:
    """Per sample, the top-k detections (LiDAR-frame rows (k, 9), scores, labels)."""
    model.eval()
    out = []
    for batch in batches(samples, cfg):
        with torch.autocast(device.type, torch.bfloat16, enabled=cfg.amp):
            heat, code = model([p.to(device) for p, _, _ in batch])
        out += decode(heat, code, model.grid, cfg.top_k)
    return [(b.numpy(), s.numpy(), l.numpy()) for b, s, l in out]
