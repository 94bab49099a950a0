"""quest-bench task ``spurious``: does a variant learn the robust signal or the shortcut?

Trains ProbeModel on the mixed (50% biased) distribution and evaluates on held-out unbiased and biased samples.
A run "learned the robust solution" when its unbiased accuracy is at least halfway (``success_fraction`` = 0.5)
from the floor to the ceiling of the same held-out set: the floor is a reader that ignores x^k (uniform attention,
which is what the shortcut alone gives on unbiased samples, where b never occurs); the ceiling is the Bayes-optimal
reader of the robust signal. ``robust_fraction`` is the same position as a number (0 = floor, 1 = ceiling);
``robust_success_75`` and ``robust_success_90`` are the same judgement at 0.75 and 0.9 of the way.

Two data designs (``design``): ``covariance`` (the paper's: the answer token's x^k has a larger variance on the
first ``signal_dims`` dims, read by a nonlinear key network) and ``norm`` (the variance is larger on every dim and
the key map is linear, so the signal lives only in the raw key's norm, which key normalisation discards).

Every variant starts at the same inverse temperature: ‖q‖ at init is ``query_init_norm``, by default sqrt(head_dim),
the value qknorm's scale g starts at.
"""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import StepTraining, param
from quest_sdk.task import Resources, Task


@dataclass
class SpuriousConfig(StepTraining):
    seq_len: int = param(16, ge=2)  # N tokens per sample
    key_dim: int = param(8, ge=1)  # dimension of x^k
    num_values: int = param(8, ge=2)  # C, number of one-hot values (chance = 1/C)
    signal_dims: int = param(4, ge=0)  # how many dims of the unbiased answer token have variance signal_var
    signal_var: float = param(2.0, gt=0)  # Σ = diag(signal_var × signal_dims, 1 × rest)
    bias_norm: float = param(3.0, ge=0)  # ‖b‖ of the shared shortcut mean
    bias_var: float = param(0.1, gt=0)  # biased answer tokens ~ N(b, bias_var · I)
    p_biased: float = param(0.5, ge=0, le=1)  # fraction of biased training samples
    data_seed: int = param(0, ge=0)  # fixes b (shared by all runs)
    design: str = param("covariance", choices=("covariance", "norm"))  # where the robust signal lives: in the
    # covariance of signal_dims dims (nonlinear keys), or, isotropic on every dim (signal_dims ignored), only in the
    # norm of a linear key
    head_dim: int = param(16, ge=1)
    hidden: int = param(32, ge=1)
    query_init_norm: float = param(0.0, ge=0)  # ‖q‖ at init (the initial inverse temperature of quest and
    # softmax); 0 = sqrt(head_dim), where qknorm's scale g starts, so every variant starts equally sharp
    steps: int = 1500
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.0
    decay_query_and_scales: bool = True  # apply weight decay to the query (QUEST's temperature) and qknorm scales
    warmup_steps: int = 50
    eval_samples: int = param(4000, ge=1)
    log_every: int = 25
    success_fraction: float = param(0.5, ge=0, le=1)  # success: unbiased acc >= floor + success_fraction · (bayes - floor)

    def __post_init__(self):
        super().__post_init__()
        if self.signal_dims > self.key_dim:
            raise ValueError(f"signal_dims ({self.signal_dims}) must be <= key_dim ({self.key_dim})")

    def data(self):
        """The probe's data generator (``quest_spurious.data.ProbeData``) for this config."""
        from quest_spurious.data import ProbeData  # imports torch: only when a run needs data

        signal_dims = self.key_dim if self.design == "norm" else self.signal_dims
        return ProbeData(self.seq_len, self.key_dim, self.num_values, signal_dims, self.signal_var,
                         self.bias_norm, self.bias_var, self.p_biased, self.data_seed)

    @property
    def initial_query_norm(self) -> float:
        return self.query_init_norm or self.head_dim ** 0.5


class SpuriousTask(Task):
    name = "spurious"
    version = "4"  # 4: ‖q‖ at init sqrt(head_dim) (was 1); the `norm` design; success at 0.75 and 0.9 too
    # (3: the shared engine: linear warm-up then cosine to 0, per-step sample generators)
    primary_metric = "robust_success"
    higher_is_better = True
    leaderboard_metrics = {"robust_success_75": True, "robust_success_90": True, "robust_fraction": True,
                           "unbiased_acc": True, "biased_acc": True}
    # the norm of the key that carries the biased answer: the probe's mechanism, plotted on a log axis
    curve_keys = (*Task.curve_keys, "biased_answer_key_norm")
    log_curve_keys = (*Task.log_curve_keys, "biased_answer_key_norm")
    config_class = SpuriousConfig
    entry_point = "quest_spurious.experiment:run"
    presets = {"tiny": {}, "small": {"steps": 3000}, "paper": {"steps": 6000, "seq_len": 32}}
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=1), "paper": Resources(num_cpus=1)}
