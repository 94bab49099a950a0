"""quest-bench task ``segmentation``: mmsegmentation's Segmenter (ViT + mask transformer) with a quest-core attention
variant, trained and evaluated by mmengine's ``Runner`` with mmseg's ``IoUMetric``: mIoU and aAcc clean and under the
shared corruption suite, with stability telemetry.

The model, data pipeline, optimizer and schedule live in an mmseg config (``quest_segmentation/configs``); the
typed ``SegmentationConfig`` below holds what quest-bench varies and writes it into that config.
"""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import param
from quest_sdk.task import Resources, Task, Throughput, transformer_train_flops


@dataclass
class SegmentationConfig:
    """Not a ``quest_sdk.config.TrainingConfig``: mmengine's Runner trains, and the optimizer, its schedule, warm-up,
    clipping and precision are the mmseg config file's (``config``); ``iters``, ``batch_size`` and ``lr`` override
    the file's values (0 keeps them)."""

    config: str = "segmenter_vit-tiny_mosaics-64x64.py"  # an mmseg config: in quest_segmentation/configs, or a path.
    # mmseg configs are Python files: a path given here is executed, so pass only configs you trust
    dataset: str = param("mosaics", choices=("mosaics", "ade20k"))  # mosaics (generated from the photos bundled in
    # scikit-image) | ade20k (from --data-root)
    mosaic_train: int = param(1000, ge=1)  # generated training images
    mosaic_val: int = param(200, ge=1)  # generated validation images
    mosaic_size: int = param(64, ge=16)
    iters: int = param(0, ge=0)  # training iterations (0 = the config's)
    batch_size: int = param(0, ge=0)  # training batch (0 = the config's)
    lr: float = param(0.0, ge=0)  # peak learning rate (0 = the config's)
    num_workers: int = param(-1, ge=-1)  # data loader workers (-1 = the config's)
    pretrained: str = ""  # backbone checkpoint (mmseg layout), relative to --data-root or absolute
    init_from: str = ""  # or: the folder of a finished image-cls run of the same variant, whose ViT starts the
    # backbone (quest_segmentation.init_from; its size must match the config's backbone)
    val_fraction: float = param(0.1, ge=0, lt=1)  # of the training images, held out (fixed, not the run's seed) for
    # choosing hyper-parameters: val_miou (0 = train on all)
    corruption_samples: int = param(200, ge=0)  # validation images per (corruption, severity); 0 = skip corruptions
    log_every: int = param(20, ge=1)  # telemetry and events.jsonl every this many iterations
    figure_images: int = param(6, ge=0)  # validation images in predictions.png (0 = no figure)

    def __post_init__(self):
        if self.pretrained and self.init_from:
            raise ValueError("set pretrained (an mmseg checkpoint) or init_from (an image-cls run), not both")


class SegmentationTask(Task):
    name = "segmentation"
    version = "3"  # 3: a different validation split (quest_sdk draws it; it was scikit-learn's)
    primary_metric = "miou"
    validation_metric = "val_miou"
    higher_is_better = True
    leaderboard_metrics = {"aacc": True, "corrupted_miou": True}
    config_class = SegmentationConfig
    entry_point = "quest_segmentation.experiment:run"
    single_worker_reason = ("mmengine's Runner here runs without a launcher: it would shard the data by rank but "
                            "never synchronise gradients, so each worker would train its own model")
    presets = {
        # each preset names its config's learning rate, so that a -tuned suite finds the default recipe in its grid
        "tiny": {"lr": 2e-3},
        "small": {"mosaic_train": 4000, "mosaic_val": 500, "iters": 3000, "lr": 2e-3},
        "paper": {"config": "segmenter_vit-t_quest_8xb1-160k_ade20k-512x512.py", "dataset": "ade20k",
                  "batch_size": 8, "lr": 1e-3,  # mmseg's 8 GPUs x 1 image, on the one GPU a run gets; its SGD rate
                  "val_fraction": 0.05,  # ~1,000 of ADE20K's 20,210 training images
                  "corruption_samples": 2000},
    }
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
                 "paper": Resources(num_cpus=8, num_gpus=1, memory_gb=32, throughput=Throughput(
                     160_000 * 8, transformer_train_flops(12, 192, (512 // 16) ** 2),
                     "mmseg's 160k iterations x 8 crops of 512 x 512; the ViT-T backbone at 1,024 tokens (the "
                     "mask-transformer decoder not counted: a lower bound)"))}

    shipped_datasets = ("mosaics",)

    def reads_data_root(self, cfg: SegmentationConfig) -> bool:
        from pathlib import Path

        return super().reads_data_root(cfg) or bool(cfg.pretrained and not Path(cfg.pretrained).is_absolute())

    def data_layout(self, cfg: SegmentationConfig) -> str:
        parts = (["ADEChallengeData2016/{images,annotations}/{training,validation}/ (ADEChallengeData2016.zip unzipped "
                  "there)"] if cfg.dataset == "ade20k" else [])
        return " and ".join(parts + ([cfg.pretrained] if cfg.pretrained else []))

    def check_layout(self, cfg: SegmentationConfig, root) -> None:
        from pathlib import Path

        from quest_segmentation.data import ade20k_root

        if cfg.dataset == "ade20k":
            ade20k_root(root)
        if cfg.pretrained and not Path(cfg.pretrained).is_absolute() and not (root / cfg.pretrained).is_file():
            raise ValueError(f"pretrained={cfg.pretrained!r}: no file {root / cfg.pretrained} (a relative checkpoint "
                             "is read from --data-root)")
