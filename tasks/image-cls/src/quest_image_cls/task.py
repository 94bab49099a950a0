"""quest-bench task ``image-cls``: a timm ViT trained with a quest-core attention variant; clean accuracy,
corruption robustness (mCE in the leaderboard), adversarial accuracy, attention maps, stability telemetry."""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import EpochTraining, param
from quest_sdk.task import Resources, Task, Throughput, transformer_train_flops


@dataclass
class ImageClsConfig(EpochTraining):
    dataset: str = param("digits", choices=("digits", "cifar10", "cifar100", "imagenet"))  # digits ships; the others
    # are read from --data-root
    img_size: int = param(28, ge=1)
    patch_size: int = param(7, ge=1)
    embed_dim: int = param(64, ge=1)
    depth: int = param(3, ge=1)
    num_heads: int = param(4, ge=1)
    mlp_ratio: float = param(2.0, gt=0)
    drop_path: float = param(0.0, ge=0, lt=1)
    epochs: int = 30
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.05  # AdamW, on weight matrices only (quest_sdk.engine.decay_groups)
    label_smoothing: float = param(0.0, ge=0, lt=1)
    mixup: float = param(0.0, ge=0)  # timm Mixup alpha (0 = off)
    cutmix: float = param(0.0, ge=0)  # timm CutMix alpha (0 = off)
    randaugment: str = ""  # timm auto_augment string, e.g. "rand-m9-mstd0.5-inc1" (ImageNet only)
    shift_pixels: int = param(0, ge=0)  # random translation of the shipped digits (0 = off: it cost accuracy here)
    grad_checkpointing: bool = False  # recompute each block's activations in backward (timm's): the same
    # gradients for about a third more compute, so that ViT-B/L fit a 24 GB GPU at the recipe's 128 images per GPU
    num_workers: int = param(0, ge=0)
    val_fraction: float = param(0.1, ge=0, lt=1)  # of the training images, held out (class-stratified, the same
    # split for every run) for val_acc, what a -tuned suite selects on; 0 = none
    eval_samples: int = param(0, ge=0)  # 0 = the whole test split
    corruption_samples: int = param(1000, ge=1)  # test images per (corruption, severity): a class-balanced subset
    adv_samples: int = param(500, ge=1)  # test images attacked: a class-balanced subset
    adv_eps: float = param(8 / 255, ge=0, le=1)  # L∞ budget in [0, 1] pixel units
    pgd_steps: int = param(10, ge=1)
    pgd_step_size: float = param(2 / 255, gt=0, le=1)
    autoattack: bool = False  # ART's AutoAttack ensemble -> autoattack_acc
    standard_autoattack: bool = False  # torchattacks' standard AutoAttack -> std_autoattack_acc (slow; on at paper)
    log_every: int = 20
    figure_images: int = param(6, ge=1)

    def __post_init__(self):
        super().__post_init__()
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size ({self.img_size}) must be a multiple of patch_size ({self.patch_size})")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim ({self.embed_dim}) must be a multiple of num_heads ({self.num_heads})")


# The paper's ImageNet-1k models: name, (embed_dim, depth, num_heads), all with /16 patches and MLP ratio 4
# (Dosovitskiy et al. 2021; Ti from Touvron et al. 2021).
VIT_SIZES = {"ViT-Ti/16": (192, 12, 3), "ViT-S/16": (384, 12, 6), "ViT-B/16": (768, 12, 12),
             "ViT-L/16": (1024, 24, 16)}
# The DeiT recipe through timm (Touvron et al. 2021), the same for every size: global batch 1,024 (8 GPUs x 128),
# lr 5e-4 x batch / 512, AdamW with weight decay 0.05, 5 warm-up epochs, label smoothing 0.1, mixup 0.8, cutmix 1.0,
# RandAugment m9, stochastic depth 0.1; then the robustness evaluation of the paper's comparison.
DEIT_RECIPE = {
    "dataset": "imagenet", "img_size": 224, "patch_size": 16, "mlp_ratio": 4.0, "drop_path": 0.1, "batch_size": 1024,
    "lr": 1e-3, "weight_decay": 0.05, "warmup_epochs": 5, "label_smoothing": 0.1, "mixup": 0.8, "cutmix": 1.0,
    "randaugment": "rand-m9-mstd0.5-inc1", "amp": True, "num_workers": 10, "corruption_samples": 5000,
    "adv_samples": 1000, "adv_eps": 1 / 255, "pgd_steps": 20, "pgd_step_size": 0.25 / 255, "autoattack": True,
    "standard_autoattack": True,
    "val_fraction": 0.01,  # 12.8k training images
}
# preset -> (model, the paper's epochs, activations recomputed in backward): ViT-B/L recompute so that the recipe's
# 128 images per GPU fit a 24 GB GPU (the shipped manifests' A10G; docs/cluster.md)
PAPER_PRESETS = {"paper": ("ViT-Ti/16", 300, False), "paper-vit-s": ("ViT-S/16", 200, False),
                 "paper-vit-b": ("ViT-B/16", 100, True), "paper-vit-l": ("ViT-L/16", 100, True)}
PAPER_WORKERS = 8  # one GPU each: the batch per GPU is batch_size / PAPER_WORKERS
IMAGENET_TRAIN_IMAGES = 1_281_167


def paper_preset(model: str, epochs: int, grad_checkpointing: bool) -> dict:
    """A ``paper``-family preset: the DeiT recipe on ``model`` (a ``VIT_SIZES`` key) for ``epochs``."""
    dim, depth, heads = VIT_SIZES[model]
    return {**DEIT_RECIPE, "embed_dim": dim, "depth": depth, "num_heads": heads, "epochs": epochs,
            "grad_checkpointing": grad_checkpointing}


def paper_resources(model: str, epochs: int, grad_checkpointing: bool) -> Resources:
    """``PAPER_WORKERS`` single-GPU workers and the training FLOPs of the preset: 6 N T with attention at
    (224 / 16)^2 + 1 tokens, plus one more forward per sample where activations are recomputed."""
    preset = paper_preset(model, epochs, grad_checkpointing)
    tokens = (preset["img_size"] // preset["patch_size"]) ** 2 + 1
    flops = transformer_train_flops(preset["depth"], preset["embed_dim"], tokens, preset["mlp_ratio"],
                                    3 * preset["patch_size"] ** 2 * preset["embed_dim"])  # + the patch embedding
    recompute = "; activations recomputed in backward: one more forward, 4/3 the FLOPs" if grad_checkpointing else ""
    return Resources(  # per worker: 128 of the 1,024 batch
        num_cpus=10, num_gpus=1, workers=PAPER_WORKERS, memory_gb=32,
        throughput=Throughput(
            epochs * IMAGENET_TRAIN_IMAGES * (1 - preset["val_fraction"]), flops * (4 / 3 if grad_checkpointing else 1),
            f"{epochs} epochs x ImageNet-1k's {IMAGENET_TRAIN_IMAGES:,} training images less the 1% validation "
            f"split; {model} at {tokens} tokens (6 N T with attention; data loading and evaluation not counted)"
            f"{recompute}"))


class ImageClsTask(Task):
    name = "image-cls"
    version = "6"  # 6: elliptical variants under grad_checkpointing (paper-vit-b/l) replay the forward metric; 5: a new validation split
    # (3: the shared engine; 2: no weight decay on pos_embed, cls_token, qknorm-hs gain)
    primary_metric = "test_acc"
    higher_is_better = True
    validation_metric = "val_acc"
    leaderboard_metrics = {"corrupted_acc": True, "fgsm_acc": True, "pgd_acc": True, "std_autoattack_acc": True}
    config_class = ImageClsConfig
    entry_point = "quest_image_cls.experiment:run"
    presets = {
        "tiny": {},
        "small": {"embed_dim": 128, "depth": 6, "num_heads": 4, "epochs": 30, "mlp_ratio": 4.0, "drop_path": 0.05},
        **{name: paper_preset(*how) for name, how in PAPER_PRESETS.items()},  # ViT-Ti/S/B/L/16, the DeiT recipe
    }
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
                 **{name: paper_resources(*how) for name, how in PAPER_PRESETS.items()}}

    shipped_datasets = ("digits",)

    def data_layout(self, cfg: ImageClsConfig) -> str:
        from quest_image_cls.data import LAYOUTS

        return LAYOUTS[cfg.dataset]

    def check_layout(self, cfg: ImageClsConfig, root) -> None:
        from quest_image_cls.data import check_root

        check_root(cfg.dataset, root)
