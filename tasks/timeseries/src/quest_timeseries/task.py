"""quest-bench task ``timeseries``: multivariate time-series classification (UEA archive sets, read with aeon) with a
transformer encoder whose attention is a quest-core variant; test and validation accuracy beside the train-majority
baseline, accuracy under noise, missing steps, time warping and channel scaling, attention telemetry."""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import EpochTraining, param
from quest_sdk.task import Resources, Task, Throughput, transformer_train_flops


@dataclass
class TimeseriesConfig(EpochTraining):
    dataset: str = "JapaneseVowels"  # a UEA multivariate problem: JapaneseVowels and BasicMotions ship with aeon,
    # any other is read from --data-root (<root>/Multivariate_ts/<Name>/<Name>_{TRAIN,TEST}.ts)
    val_fraction: float = param(0.2, gt=0, lt=1)  # of the official TRAIN set, stratified, fixed seed (not the run's)
    patch_len: int = param(1, ge=1)  # steps per token
    dim: int = param(64, ge=1)  # transformer width
    depth: int = param(2, ge=1)  # pre-norm blocks
    num_heads: int = param(4, ge=1)
    mlp_ratio: float = param(2.0, gt=0)  # MLP hidden width / dim
    dropout: float = param(0.1, ge=0, lt=1)  # on attention weights, attention output and MLP output
    epochs: int = 40  # over the training part (TRAIN less validation)
    batch_size: int = 16
    weight_decay: float = 0.05  # on weight matrices only (quest_sdk.engine.decay_groups)
    warmup_epochs: float = 2.0
    label_smoothing: float = param(0.1, ge=0, lt=1)
    augment: bool = False  # a random crop of 80-100 % of each training series' observed steps
    corruption_samples: int = param(0, ge=0)  # test series per (corruption, severity), stratified; 0 = all

    def __post_init__(self):
        super().__post_init__()
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")


class TimeseriesTask(Task):
    name = "timeseries"
    version = "2"  # 2: a different validation split (quest_sdk draws it; it was scikit-learn's)
    primary_metric = "test_acc"
    higher_is_better = True
    validation_metric = "val_acc"
    leaderboard_metrics = {"mean_class_acc": True, "corrupted_acc": True}
    config_class = TimeseriesConfig
    entry_point = "quest_timeseries.experiment:run"
    presets = {
        "tiny": {},
        "small": {"dim": 128, "depth": 3, "num_heads": 8, "epochs": 100},
        "paper": {  # a TST-sized encoder (Zerveas et al. 2021: 3 layers, width 128, 8 heads) on a larger UEA set
            "dataset": "SpokenArabicDigits", "dim": 128, "depth": 3, "num_heads": 8, "mlp_ratio": 2.0,
            "epochs": 100, "batch_size": 64, "lr": 1e-3, "warmup_epochs": 5, "amp": True, "log_every": 50,
        },
    }
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
                 "paper": Resources(num_cpus=8, num_gpus=1, memory_gb=8, throughput=Throughput(
                     100 * 6_599, transformer_train_flops(3, 128, 93, 2.0),
                     "100 epochs x SpokenArabicDigits' 6,599 training series of at most 93 steps"))}

    shipped_datasets = ("JapaneseVowels", "BasicMotions")  # in aeon's wheel (quest_timeseries.data.SHIPPED)

    def data_layout(self, cfg: TimeseriesConfig) -> str:
        return (f"Multivariate_ts/{cfg.dataset}/{cfg.dataset}_{{TRAIN,TEST}}.ts (the UEA archive "
                "Multivariate2018_ts.zip, unzipped there)")

    def check_layout(self, cfg: TimeseriesConfig, root) -> None:
        from quest_timeseries.data import ts_files

        ts_files(cfg.dataset, str(root))
