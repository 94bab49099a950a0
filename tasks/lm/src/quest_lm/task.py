"""quest-bench task ``lm``: a GPT-style causal decoder (quest_lm.model) on WikiText with a quest-core attention
variant; validation/test perplexity per word against the unigram baseline, perplexity under input-token
substitution, attention telemetry over training, and the loss-spike count the stability-margin suite reads."""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import StepTraining, param
from quest_sdk.task import Resources, Task, Throughput, transformer_train_flops


@dataclass
class LmConfig(StepTraining):
    dataset: str = param("wikitext-mini", choices=("wikitext-mini", "wikitext-2", "wikitext-103"))  # wikitext-mini
    # ships; the others are read from --data-root
    tokenizer: str = param("word", choices=("word", "bpe"))  # word (WikiText's own vocabulary) | bpe (trained on train)
    bpe_vocab: int = param(8000, ge=2)  # BPE merges stop at this vocabulary size (the characters come first)
    context: int = param(64, ge=2)  # tokens per training window and per evaluation window
    dim: int = param(128, ge=1)
    depth: int = param(2, ge=1)
    num_heads: int = param(4, ge=1)
    mlp_ratio: float = param(4.0, gt=0)
    dropout: float = param(0.1, ge=0, lt=1)
    adaptive_cutoffs: str = param("2000,6000", items=int, ge=1)  # adaptive-softmax cluster bounds (by frequency
    # rank); "" = tied softmax
    adaptive_div: float = param(4.0, ge=1)  # each tail cluster's projection is div times narrower than the previous
    steps: int = 700
    batch_size: int = 16
    lr: float = 3e-3  # peak learning rate (AdamW), after linear warm-up; cosine decay to min_lr_ratio * lr
    warmup_steps: int = 50
    min_lr_ratio: float = param(0.1, ge=0, le=1)
    weight_decay: float = 0.1  # on weight matrices and embeddings; not on biases, norms or attention gains
    grad_clip: float = 1.0
    eval_tokens: int = param(0, ge=0)  # evaluate on the first N tokens of valid/test (0 = all)
    corruption_rates: str = param("0.05,0.1,0.2", items=float, gt=0, le=1)  # input-token substitution rates for
    # corrupted perplexity
    spike_threshold: float = param(0.5, gt=0)  # a loss spike: smoothed loss this many nats above its running minimum
    log_every: int = 20

    def __post_init__(self):
        super().__post_init__()
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")
        cutoffs = [int(c) for c in self.adaptive_cutoffs.split(",") if c.strip()]
        if cutoffs != sorted(set(cutoffs)):
            raise ValueError(f"adaptive_cutoffs must increase strictly, got {self.adaptive_cutoffs!r}")


class LmTask(Task):
    name = "lm"
    version = "3"  # 3: the shared engine (quest_sdk.engine): per-step window generators; 2: unigram baseline on the evaluated slice
    primary_metric = "test_ppl"
    validation_metric = "valid_ppl"
    higher_is_better = False
    leaderboard_metrics = {"valid_ppl": False, "corrupted_ppl": False, "loss_spikes": False}
    stability_note = "no loss spike and a validation perplexity better than the unigram baseline"  # experiment.py
    config_class = LmConfig
    entry_point = "quest_lm.experiment:run"
    presets = {
        "tiny": {},
        "small": {"context": 128, "dim": 256, "depth": 4, "num_heads": 4, "adaptive_cutoffs": "", "steps": 3000,
                  "batch_size": 32, "lr": 1e-3, "warmup_steps": 200},
        "paper": {  # Transformer-XL base's size on WikiText-103 (Dai et al. 2019), without its segment recurrence
            "dataset": "wikitext-103", "context": 512, "dim": 410, "depth": 16, "num_heads": 10,
            "mlp_ratio": 2100 / 410, "dropout": 0.1, "adaptive_cutoffs": "20000,40000,200000", "adaptive_div": 1.0,
            "steps": 200_000, "batch_size": 60, "lr": 2.5e-4, "warmup_steps": 1000, "min_lr_ratio": 0.0,
            "weight_decay": 0.0, "grad_clip": 0.25, "amp": True, "log_every": 200,
        },
    }
    resources = {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
                 "paper": Resources(  # per worker: 15 of the 60 windows
                     num_cpus=8, num_gpus=1, workers=4, memory_gb=32,
                     throughput=Throughput(
                         200_000 * 60, transformer_train_flops(16, 410, 512, 2100 / 410, 410 * 20_003),
                         "200k steps x 60 windows of 512 tokens; 16 x 410 decoder plus the adaptive softmax's head "
                         "cluster (20,000 words + 3 tails), tail clusters not counted"))}

    shipped_datasets = ("wikitext-mini",)

    def data_layout(self, cfg: LmConfig) -> str:
        return (f"{cfg.dataset}/wiki.{{train,valid,test}}.tokens ({cfg.dataset}-v1.zip unzipped there), or those "
                "files directly in it")

    def check_layout(self, cfg: LmConfig, root) -> None:
        from quest_lm.data import find_wikitext

        try:
            find_wikitext(str(root), cfg.dataset)
        except FileNotFoundError as err:
            raise ValueError(f"{err}; expected under {root}: {self.data_layout(cfg)}") from None
