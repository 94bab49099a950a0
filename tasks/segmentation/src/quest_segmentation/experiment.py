"""A ``segmentation`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_segmentation.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

import quest_segmentation.mmcv_shim  # noqa: F401  (before mmengine/mmseg: the mmcv-lite shim)
from mmengine.hooks import Hook

from quest_sdk.data import require_data_root
from quest_sdk.robustness import corruption_summary
from quest_sdk.task import TaskOutput
from quest_core import Telemetry, summarize
from quest_sdk.image_corruptions import CORRUPTIONS, SEVERITIES
from quest_segmentation import data as D
from quest_segmentation.figures import prediction_figure
from quest_segmentation.task import SegmentationConfig


def run(cfg: SegmentationConfig, ctx) -> TaskOutput:
    from mmengine.runner import Runner

    mm_cfg, data_id = mmseg_config(cfg, ctx)
    runner = Runner.from_cfg(mm_cfg)
    runner.register_hook(QuestRunHook(ctx, mm_cfg.train_cfg.max_iters, cfg.log_every, run_fingerprint(cfg, ctx)),
                         priority="LOW")
    runner.train()
    clean = runner.test()
    metrics = {"miou": clean["mIoU"] / 100, "aacc": clean["aAcc"] / 100, "macc": clean["mAcc"] / 100}
    if cfg.val_fraction:  # mmseg_config trained on the kept images (a config's own ann_file is not a tuning split)
        metrics["val_miou"] = tuning_miou(runner, mm_cfg)
    if cfg.corruption_samples:
        metrics.update(corruption_metrics(runner, mm_cfg, cfg.corruption_samples, ctx.seed))
    if cfg.figure_images:
        prediction_figure(runner, cfg.figure_images, Path(ctx.out_dir) / "predictions.png",
                          f"{ctx.variant}: validation predictions (mIoU {metrics['miou']:.3f})")
    samples = mm_cfg.train_cfg.max_iters * mm_cfg.train_dataloader.batch_size
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data_id}, samples_seen=samples)


CONFIGS = Path(__file__).parent / "configs"


def mmseg_config(cfg: SegmentationConfig, ctx):
    """The mmengine ``Config`` for one run: the named mmseg config plus the run's variant, data, seed and folders."""
    from mmengine.config import Config

    path = Path(cfg.config) if Path(cfg.config).is_file() else CONFIGS / cfg.config
    if not path.is_file():
        raise FileNotFoundError(f"no mmseg config {cfg.config!r}; shipped: "
                                f"{', '.join(sorted(p.name for p in CONFIGS.glob('*.py')))} (or give a path)")
    mm_cfg = Config.fromfile(str(path))
    if cfg.dataset == "mosaics":
        root = D.texture_mosaics(cfg.mosaic_train, cfg.mosaic_val, cfg.mosaic_size)
        data_id = f"texture mosaics {root.name}"
    elif cfg.dataset == "ade20k":
        root = D.ade20k_root(require_data_root(ctx.data_root, "ade20k"))
        data_id = str(root)
    else:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; valid: mosaics, ade20k")
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        mm_cfg[loader].dataset.data_root = str(root)
        if cfg.num_workers >= 0:
            mm_cfg[loader].num_workers = cfg.num_workers
            mm_cfg[loader].persistent_workers = cfg.num_workers > 0
    split = D.tuning_split(root, cfg.val_fraction, Path(ctx.out_dir) / "splits")
    if split:  # train on the rest; tuning_miou scores the held-out images after training
        mm_cfg.train_dataloader.dataset.ann_file = str(split[0])
    mm_cfg.model.attention = ctx.variant
    if cfg.pretrained:
        weights = Path(cfg.pretrained)
        mm_cfg.model.pretrained = str(weights if weights.is_absolute() else Path(ctx.data_root or ".") / weights)
    if cfg.init_from:  # an image-cls run's ViT, in mmseg's layout (its patch embedding has a bias, mmseg's none)
        from quest_segmentation.init_from import image_cls_backbone

        weights = image_cls_backbone(Path(cfg.init_from), ctx.variant, Path(ctx.out_dir) / "init_from_image_cls.pth")
        mm_cfg.model.pretrained = str(weights)
        mm_cfg.model.backbone.patch_bias = True
    if cfg.batch_size:
        mm_cfg.train_dataloader.batch_size = cfg.batch_size
    if cfg.lr:
        mm_cfg.optim_wrapper.optimizer.lr = cfg.lr
    exclude_variant_params_from_decay(mm_cfg)
    if cfg.iters:
        set_iters(mm_cfg, cfg.iters)
    # checkpoints as the shared engine makes them (every --checkpoint-every iterations, default ten per run, and at
    # the end; only the latest kept), in mmengine's own format; a run started again in the same folder resumes from
    # the latest (mmengine restores weights, optimizer, schedulers and its message hub, and replays the data loader)
    checkpoint = mm_cfg.default_hooks.checkpoint
    checkpoint.interval = ctx.checkpoint_every or max(1, mm_cfg.train_cfg.max_iters // 10)
    checkpoint.by_epoch, checkpoint.save_last, checkpoint.max_keep_ckpts = False, True, 1
    mm_cfg.resume = True
    mm_cfg.work_dir = str(Path(ctx.out_dir) / "mmseg")
    set_aside_unusable_checkpoint(Path(mm_cfg.work_dir), Path(ctx.out_dir), run_fingerprint(cfg, ctx))
    # mmengine keeps one Visualizer per name per process; a Ray worker runs many runs, so name it per run.
    mm_cfg.visualizer.name = f"visualizer-{Path(ctx.out_dir).name}-{id(ctx)}"
    mm_cfg.randomness = dict(seed=ctx.seed, deterministic=False)
    if ctx.device == "cpu":
        mm_cfg.env_cfg.dist_cfg = dict(backend="gloo")
    return mm_cfg, data_id


def run_fingerprint(cfg: SegmentationConfig, ctx) -> str:
    """What a checkpoint must have been written by to be resumed: this task version, quest-core version, attention
    variant and config (its data-loader worker count aside). mmengine resumes any checkpoint it can read, leniently,
    so a checkpoint of other code or another configuration is told apart by this value, which it carries."""
    import dataclasses
    import hashlib
    import json
    from importlib.metadata import version

    from quest_segmentation.task import SegmentationTask

    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "num_workers"}
    what = {"task": SegmentationTask.version, "quest_core": version("quest-core"), "variant": ctx.variant,
            "config": config}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def set_aside_unusable_checkpoint(work_dir: Path, run_dir: Path, fingerprint: str) -> None:
    """Before mmengine resumes from the latest checkpoint of ``work_dir`` (named in its ``last_checkpoint`` file),
    read it as mmengine will (weights-only, with the shim's allow-list); one that is unreadable, or was written by
    another run (its ``quest_run`` is not ``fingerprint``: other code, variant or config) is set aside by the rule of
    every checkpoint store (``quest_sdk.checkpoint.record_set_aside``: renamed to ``checkpoint.unusable.pt`` in the
    run folder with the reason, once; a second one raises ``UnusableCheckpoint``) and mmengine starts over."""
    from quest_sdk.checkpoint import record_set_aside

    pointer = work_dir / "last_checkpoint"
    if not pointer.exists():
        return
    latest = Path(pointer.read_text().strip())
    try:
        checkpoint = torch.load(latest, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: starting over loses time, not results
        record_set_aside(run_dir, latest, f"{type(err).__name__}: {err}", kind="unreadable")
        pointer.unlink()
        return
    written_by = checkpoint.get("quest_run") if isinstance(checkpoint, dict) else None
    if written_by != fingerprint:
        record_set_aside(run_dir, latest, f"written by another run (fingerprint {written_by}, this run's "
                         f"{fingerprint}: other code, variant or config)", kind="another run's")
        pointer.unlink()


def exclude_variant_params_from_decay(mm_cfg) -> None:
    """mmengine's optimizer: no weight decay on the attention variants' parameters whose declaration says so
    (``quest_core.Param.weight_decay``), as ``quest_sdk.engine.decay_groups`` does in the other tasks."""
    import quest_core

    paramwise = mm_cfg.optim_wrapper.setdefault("paramwise_cfg", {})
    keys = paramwise.setdefault("custom_keys", {})
    for name in quest_core.list_variants():
        for param in quest_core.get_variant(name).params:
            if not param.weight_decay:
                keys[param.name] = dict(decay_mult=0.0)


def set_iters(mm_cfg, iters: int) -> None:
    """Shorten or lengthen the schedule: the loop and the schedulers' ends (scaled)."""
    old = mm_cfg.train_cfg.max_iters
    mm_cfg.train_cfg.max_iters = iters
    mm_cfg.train_cfg.val_interval = iters + 1  # validation once, after training (runner.test)
    for sched in mm_cfg.param_scheduler:
        sched.begin = round(sched.get("begin", 0) * iters / old)
        sched.end = max(sched.begin + 1, round(sched.get("end", old) * iters / old))


class QuestRunHook(Hook):
    """An mmengine hook reporting as the shared engine (``quest_sdk.engine``) does: progress bar, events.jsonl rows
    with the same names (loss, lr, grad_norm when mmengine clips, the telemetry summary and per-layer
    ``<layer>/max_logit`` and ``<layer>/entropy_mean``) every ``log_every`` iterations, the divergence check (NaN
    loss or exploding logits end the run as ``diverged``), and the step a resumed run restarted from. The last
    telemetry summary (``ctx.telemetry_last``, the ``final_*`` metrics) travels in mmengine's checkpoints, as it
    does in the engine's."""

    priority = "LOW"

    def __init__(self, ctx, total: int, log_every: int, fingerprint: str):
        self.ctx, self.total, self.log_every, self.fingerprint = ctx, total, log_every, fingerprint
        self.telemetry = self.bar = None

    def _logging(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.total - 1

    def before_train(self, runner) -> None:
        self.telemetry = Telemetry(runner.model, max_queries=64)
        self.ctx.resumed_from_step = runner.iter  # > 0 when mmengine resumed from a checkpoint in the run folder
        self.ctx.begin(runner.iter)
        self.bar = self.ctx.bar(self.total, "segmentation", initial=runner.iter)
        logging.getLogger("mmengine").setLevel(logging.WARNING)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self._logging(runner.iter):
            self.telemetry.__enter__()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        step = runner.iter + 1
        loss = outputs["loss"].detach().item()
        stats = None
        if self._logging(runner.iter):
            per_layer = self.telemetry.snapshot()
            self.telemetry.__exit__(None, None, None)
            stats = summarize(per_layer)
            layers = {f"{n}/{k}": v[k] for n, v in per_layer.items() for k in ("max_logit", "entropy_mean")}
            lr = runner.optim_wrapper.get_lr()["lr"][0]
            try:  # recorded by mmengine's optimizer wrapper when it clips gradients
                extra = {"grad_norm": float(runner.message_hub.get_scalar("train/grad_norm").current())}
            except KeyError:
                extra = {}
        self.ctx.check(step, loss, stats)  # before the row, as the engine does: a diverged step logs none
        if stats is not None:
            self.ctx.log(step, {"loss": loss, "lr": lr, **extra, **stats, **layers})
        self.bar.update(1)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint["quest_telemetry_last"] = dict(self.ctx.telemetry_last)
        checkpoint["quest_run"] = self.fingerprint  # what a resume checks (set_aside_unusable_checkpoint)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if "quest_telemetry_last" in checkpoint:  # a resumed run: the summary of the last row before the checkpoint
            self.ctx.telemetry_last = dict(checkpoint["quest_telemetry_last"])

    def after_train(self, runner) -> None:
        self.bar.close()


def tuning_miou(runner, mm_cfg) -> float:
    """mIoU on the held-out training images (``D.tuning_split``'s ``tune.txt``), through the test pipeline: the
    metric a ``-tuned`` suite selects hyper-parameters on, so the reported validation split stays untouched."""
    from mmengine.runner import TestLoop

    loader = mm_cfg.test_dataloader.copy()
    dataset = loader.dataset.copy()
    dataset.data_prefix = mm_cfg.train_dataloader.dataset.data_prefix
    dataset.ann_file = str(Path(mm_cfg.train_dataloader.dataset.ann_file).with_name("tune.txt"))
    loader.dataset = dataset
    return TestLoop(runner, loader, mm_cfg.test_evaluator).run()["mIoU"] / 100


def corruption_metrics(runner, mm_cfg, samples: int, seed: int) -> dict:
    """mIoU over the first ``samples`` validation images under every shared corruption and severity, each through
    the config's test pipeline with an ``ImageCorruption`` step after loading, and mmseg's ``IoUMetric``."""
    from mmengine.runner import TestLoop

    scores = {}
    for i, name in enumerate(CORRUPTIONS):
        scores[name] = []
        for severity in SEVERITIES:
            loader = mm_cfg.test_dataloader.copy()
            dataset = loader.dataset.copy()
            pipeline = list(dataset.pipeline)
            pipeline.insert(1, dict(type="ImageCorruption", name=name, severity=severity, seed=seed * 100 + i))
            dataset.pipeline, dataset.indices = pipeline, samples
            loader.dataset = dataset
            result = TestLoop(runner, loader, mm_cfg.test_evaluator).run()
            scores[name].append(result["mIoU"] / 100)
    return corruption_summary(scores, score="miou")
