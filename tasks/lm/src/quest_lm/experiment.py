"""A ``lm`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_lm.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import math

import torch

from quest_sdk.engine import Trainer, TrainSpec
from quest_sdk.task import TaskOutput
from quest_lm.data import Corpus, load_corpus
from quest_lm.model import GPT
from quest_lm.task import LmConfig


def run(cfg: LmConfig, ctx) -> TaskOutput:
    torch.manual_seed(ctx.seed)
    device = torch.device(ctx.device)
    corpus = load_corpus(ctx.data_root, cfg.dataset, cfg.tokenizer, cfg.bpe_vocab)
    cutoffs = tuple(int(c) for c in cfg.adaptive_cutoffs.split(",") if c.strip())
    model = GPT(len(corpus.vocab), ctx.variant, cfg.context, cfg.dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio,
                cfg.dropout, cutoffs, cfg.adaptive_div).to(device)
    spikes, max_rise = train(model, cfg, corpus.ids["train"], ctx)

    metrics = {"loss_spikes": float(spikes), "max_loss_rise": max_rise}
    for split in ("valid", "test"):
        metrics[f"{split}_ppl"] = perplexity(model, corpus, split, cfg, device)
        metrics[f"{split}_unigram_ppl"] = corpus.unigram_ppl(split, evaluated_fraction(corpus, split, cfg))
    rates = [float(r) for r in cfg.corruption_rates.split(",") if r.strip()]
    for rate in rates:
        metrics[f"corrupted_ppl/sub{rate:g}"] = perplexity(model, corpus, "test", cfg, device, rate, ctx.seed)
    if rates:  # geometric mean over rates (perplexities multiply)
        metrics["corrupted_ppl"] = math.exp(sum(math.log(metrics[f"corrupted_ppl/sub{r:g}"]) for r in rates) / len(rates))
    # stable: no divergence (else there is no result), no loss spike, and better than the unigram baseline
    metrics["stable"] = float(spikes == 0 and metrics["valid_ppl"] < metrics["valid_unigram_ppl"])
    return TaskOutput(metrics, data={"name": corpus.name, "revision": f"sha256:{corpus.digest}"},
                      samples_seen=cfg.steps * cfg.batch_size)


class SpikeDetector:
    """Counts loss spikes: the smoothed training loss (EMA) rising ``threshold`` nats above its running minimum.

    Watched only after warm-up; one spike per excursion (it re-arms once the loss is back within half the
    threshold). ``max_rise`` is the largest excursion seen, in nats.
    """

    def __init__(self, threshold: float, start_step: int, beta: float = 0.9):
        self.threshold, self.start_step, self.beta = threshold, start_step, beta
        self.ema: float | None = None
        self.best, self.spikes, self.max_rise, self.armed = math.inf, 0, 0.0, True

    def update(self, step: int, loss: float) -> None:
        self.ema = loss if self.ema is None else self.beta * self.ema + (1 - self.beta) * loss
        if step < self.start_step:
            return
        self.best = min(self.best, self.ema)
        rise = self.ema - self.best
        self.max_rise = max(self.max_rise, rise)
        if self.armed and rise > self.threshold:
            self.spikes, self.armed = self.spikes + 1, False
        elif rise < self.threshold / 2:
            self.armed = True

    def state_dict(self) -> dict:  # checkpointed with the run (quest_sdk.engine.Watcher)
        return {"ema": self.ema, "best": self.best, "spikes": self.spikes, "max_rise": self.max_rise,
                "armed": self.armed}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def train(model: GPT, cfg: LmConfig, train_ids: torch.Tensor, ctx) -> tuple[int, float]:
    """The shared engine on random windows of the training stream (each step's window starts drawn from the step's
    generator, shared by all workers, each training on its rows); returns (loss spikes, largest loss rise in nats)."""
    spikes = SpikeDetector(cfg.spike_threshold, start_step=cfg.warmup_steps)
    trainer = Trainer(model, ctx, TrainSpec.from_config(cfg, min_lr_ratio=cfg.min_lr_ratio, betas=(0.9, 0.95)), "lm",
                      watchers={"spikes": spikes})
    rows = trainer.shard(cfg.batch_size)

    def windows(start: int):
        for step in range(start, cfg.steps):
            starts = torch.randint(0, len(train_ids) - cfg.context - 1, (cfg.batch_size,), generator=trainer.rng(step))
            yield torch.stack([train_ids[s: s + cfg.context + 1] for s in starts[rows].tolist()])

    def loss_fn(net, window, rng):
        window = window.to(trainer.device)
        return net(window[:, :-1], window[:, 1:]).mean()

    trainer.fit(windows, loss_fn)
    return spikes.spikes, spikes.max_rise


def evaluated_fraction(corpus: Corpus, split: str, cfg: LmConfig) -> float:
    """The share of a split's predicted tokens an evaluation covers (``eval_tokens`` of them, 0 = all)."""
    total = len(corpus.ids[split]) - 1
    return 1.0 if not cfg.eval_tokens else min(cfg.eval_tokens, total) / total


@torch.no_grad()
def perplexity(model: GPT, corpus: Corpus, split: str, cfg: LmConfig, device: torch.device,
               substitution: float = 0.0, seed: int = 0) -> float:
    """Perplexity per word on non-overlapping ``context``-token windows of a split.

    With ``substitution`` > 0 each input token is replaced, with that probability, by a uniformly random token
    (seeded); the targets stay clean. Per word: the total NLL over the predicted tokens divided by the words they
    make up (whitespace tokens plus one `<eos>` per line; for BPE, pro rata), so word-level and BPE models are
    comparable; for a word-level model it is the usual per-token perplexity.
    """
    ids = corpus.ids[split]
    n_tokens = round(evaluated_fraction(corpus, split, cfg) * (len(ids) - 1))
    inputs, targets = ids[:n_tokens].clone(), ids[1: n_tokens + 1]
    if substitution > 0:
        gen = torch.Generator().manual_seed(seed * 1000 + round(substitution * 1000))
        hit = torch.rand(n_tokens, generator=gen) < substitution
        inputs[hit] = torch.randint(0, len(corpus.vocab), (int(hit.sum()),), generator=gen)
    total = 0.0
    # windows per forward pass: a full softmax materialises (windows, context, V) logits; keep them near 256 MB
    batch_windows = 64 if model.adaptive is not None else max(1, (1 << 26) // (cfg.context * len(corpus.vocab)))
    for start in range(0, n_tokens, cfg.context * batch_windows):
        chunk = slice(start, min(n_tokens, start + cfg.context * batch_windows))
        x, y = inputs[chunk], targets[chunk]
        full = len(x) // cfg.context * cfg.context
        pieces = [(x[:full].view(-1, cfg.context), y[:full].view(-1, cfg.context))] if full else []
        if full < len(x):
            pieces.append((x[full:][None], y[full:][None]))
        for xb, yb in pieces:
            with torch.autocast(device.type, torch.bfloat16, enabled=cfg.amp):
                total += float(model.token_nll(xb.to(device), yb.to(device)).double().sum())
    words = n_tokens * len(corpus.words[split]) / len(ids)  # = n_tokens for a word-level vocabulary
    return math.exp(total / words)
