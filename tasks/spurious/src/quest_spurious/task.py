"""quest-bench task ``spurious``: does a variant learn the robust signal or the shortcut?

Trains ProbeModel on the mixed (50% biased) distribution and evaluates on held-out unbiased and biased samples.
A run "learned the robust solution" when its unbiased accuracy is at least halfway (``success_fraction`` = 0.5)
from the floor to the ceiling of the same held-out set: the floor is a reader that ignores x^k (uniform attention,
which is what the shortcut alone gives on unbiased samples, where b never occurs); the ceiling is the Bayes-optimal
reader of the covariance signal. ``robust_fraction`` is the same position as a number (0 = floor, 1 = ceiling).
"""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import param
from quest_sdk.task import Resources, Task, TaskOutput


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

    def data(self):
        """The probe's data generator (``quest_spurious.data.ProbeData``) for this config."""
        from quest_spurious.data import ProbeData  # imports torch: only when a run needs data

        return ProbeData(self.seq_len, self.key_dim, self.num_values, self.signal_dims, self.signal_var,
                         self.bias_norm, self.bias_var, self.p_biased, self.data_seed)


class SpuriousTask(Task):
    name = "spurious"
    version = "3"  # 3: the shared engine (quest_sdk.engine): linear warm-up then cosine to 0, per-step sample generators
    primary_metric = "robust_success"
    higher_is_better = True
    leaderboard_metrics = {"robust_fraction": True, "unbiased_acc": True, "biased_acc": True}
    config_class = SpuriousConfig
    presets = {"tiny": {}, "small": {"steps": 3000}, "paper": {"steps": 6000, "seq_len": 32}}
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=1), "paper": Resources(num_cpus=1)}

    def run(self, cfg: SpuriousConfig, ctx) -> TaskOutput:
        from quest_spurious.experiment import run  # torch and the task's stack load only here

        return run(cfg, ctx)
