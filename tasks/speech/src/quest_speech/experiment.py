"""A ``speech`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_speech.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from quest_sdk.data import require_data_root
from quest_sdk.engine import Trainer, TrainSpec, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput
from quest_speech import data as D
from quest_speech.model import CtcModel, KeywordModel, SpeechEncoder, greedy_ctc
from quest_speech.perturb import PERTURBATIONS, perturb
from quest_speech.synth import espeak_version
from quest_speech.task import SpeechConfig, KeywordConfig, AsrConfig


def run_speech_commands(cfg: KeywordConfig, ctx) -> TaskOutput:
    device = torch.device(ctx.device)
    if cfg.dataset == "synth":
        train_set, test_set = D.keywords("train", cfg.train_per_word), D.keywords("test", cfg.test_per_word)
        train_set, val_set = train_set.hold_out_voices(cfg.val_fraction)
    elif cfg.dataset == "speechcommands":
        root = str(require_data_root(ctx.data_root, cfg.dataset))
        train_set = D.speech_commands(root, "training", cfg.limit)
        val_set = D.speech_commands(root, "validation", cfg.limit)
        test_set = D.speech_commands(root, "testing", cfg.limit)
    else:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; valid: synth, speechcommands")
    model = KeywordModel(_encoder(cfg, ctx.variant), cfg.dim, len(D.WORDS)).to(device)

    def loss_fn(net, wave, lengths, targets):
        return F.cross_entropy(net(wave, lengths), torch.as_tensor(targets, device=device))

    steps = train(model, loss_fn, train_set, cfg, ctx, "speech-commands")
    metrics = {"test_acc": keyword_accuracy(model, test_set, device),
               "real_digits_acc": keyword_accuracy(model, D.asterisk_digits(), device)}
    if val_set is not None:
        metrics["val_acc"] = keyword_accuracy(model, val_set, device)
    if cfg.perturb_samples:
        metrics.update(robustness(test_set, cfg.perturb_samples, ctx.seed,
                                  lambda utts: keyword_accuracy(model, utts, device), score="acc"))
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": _revision(cfg, train_set)},
                      samples_seen=steps * cfg.batch_size)


def run_asr(cfg: AsrConfig, ctx) -> TaskOutput:
    device = torch.device(ctx.device)
    if cfg.dataset == "synth":
        train_set, test_set = D.sentences("train", cfg.train_sentences), D.sentences("test", cfg.test_sentences)
        train_set, val_set = train_set.hold_out_voices(cfg.val_fraction)
    elif cfg.dataset == "librispeech":
        root = str(require_data_root(ctx.data_root, cfg.dataset))
        train_set = D.librispeech(root, cfg.train_split, cfg.limit)
        val_set = D.librispeech(root, cfg.val_split, cfg.limit)
        test_set = D.librispeech(root, cfg.test_split, cfg.limit)
    else:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; valid: synth, librispeech")
    model = CtcModel(_encoder(cfg, ctx.variant), cfg.dim, len(D.CHARS)).to(device)

    def loss_fn(net, wave, lengths, texts):
        log_probs_btv, n_b = net(wave, lengths)
        targets = [D.encode_text(t) for t in texts]
        return F.ctc_loss(log_probs_btv.transpose(0, 1), torch.cat(targets).to(device), n_b,
                          torch.tensor([len(t) for t in targets], device=device), zero_infinity=True)

    steps = train(model, loss_fn, train_set, cfg, ctx, "asr")
    cer, wer = error_rates(model, test_set, device)
    real_cer, real_wer = error_rates(model, D.librivox(), device)
    metrics = {"test_cer": cer, "test_wer": wer, "real_cer": real_cer, "real_wer": real_wer}
    if val_set is not None:
        metrics["val_cer"] = error_rates(model, val_set, device)[0]
    if cfg.perturb_samples:
        metrics.update(robustness(test_set, cfg.perturb_samples, ctx.seed,
                                  lambda utts: 1 - error_rates(model, utts, device)[0], score="char_acc"))
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": _revision(cfg, train_set)},
                      samples_seen=steps * cfg.batch_size)


def _encoder(cfg: SpeechConfig, variant: str) -> SpeechEncoder:
    return SpeechEncoder(variant, cfg.dim, cfg.num_heads, cfg.ffn_dim, cfg.num_layers, cfg.kernel_size, cfg.n_mels,
                         cfg.dropout, cfg.freq_mask, cfg.time_mask)


def _revision(cfg, train_set: D.Utterances) -> str:
    voices = len(set(train_set.speakers))
    text = f"{cfg.dataset}: {len(train_set)} training utterances, {voices} voices/speakers"
    if cfg.dataset == "synth":
        text += f" (synth v{D.SYNTH_VERSION}, espeak-ng {espeak_version()}, test voices {', '.join(D.voices('test'))})"
    return text


def pad_batch(audio: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Waveforms -> (B, T_max) zero-padded batch and (B,) lengths."""
    lengths = torch.tensor([len(a) for a in audio])
    return torch.nn.utils.rnn.pad_sequence(audio, batch_first=True).to(device), lengths.to(device)


def train(model, loss_fn, train_set: D.Utterances, cfg: SpeechConfig, ctx, desc: str) -> int:
    """The shared engine over shuffled epochs, with gradient clipping and the optional narrow-band augmentation
    (from the step's generator); ``loss_fn(model, wave, lengths, targets)``. Returns the steps run."""
    per_epoch = steps_per_epoch(len(train_set), cfg.batch_size, "training utterances")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, desc)

    def step_loss(net, idx, rng):
        wave, lengths = pad_batch([train_set.audio[j] for j in idx], trainer.device)
        if cfg.narrowband:
            wave = band_limit(wave, torch.rand(len(idx), generator=rng) < cfg.narrowband)
        return loss_fn(net, wave, lengths, [train_set.targets[j] for j in idx])

    trainer.fit(trainer.epoch_batches(len(train_set), cfg.batch_size).from_step, step_loss)
    return steps


def band_limit(wave_bt: torch.Tensor, rows_b: torch.Tensor) -> torch.Tensor:
    """The chosen rows resampled to 8 kHz and back: the band above 4 kHz removed (telephone audio)."""
    if not rows_b.any():
        return wave_bt
    wave_bt = wave_bt.clone()
    narrow = AF.resample(AF.resample(wave_bt[rows_b], 16_000, 8_000), 8_000, 16_000)
    wave_bt[rows_b] = narrow[:, : wave_bt.shape[1]]
    return wave_bt


def _batches(utts: D.Utterances, batch_size: int = 64):
    lengths = utts.lengths()  # from the files' headers for real data: nothing is read here
    order = sorted(range(len(utts)), key=lambda i: lengths[i])  # similar lengths: little padding
    for start in range(0, len(order), batch_size):
        yield order[start: start + batch_size]


@torch.no_grad()
def keyword_accuracy(model: KeywordModel, utts: D.Utterances, device) -> float:
    model.eval()
    hits = 0
    for idx in _batches(utts):
        pred = model(*pad_batch([utts.audio[i] for i in idx], device)).argmax(-1).cpu()
        hits += int((pred == torch.as_tensor([utts.targets[i] for i in idx])).sum())
    return hits / max(1, len(utts))


@torch.no_grad()
def transcribe(model: CtcModel, utts: D.Utterances, device) -> list[str]:
    model.eval()
    out = [""] * len(utts)
    for idx in _batches(utts):
        log_probs_btv, n_b = model(*pad_batch([utts.audio[i] for i in idx], device))
        for i, ids in zip(idx, greedy_ctc(log_probs_btv.cpu(), n_b.cpu())):
            out[i] = D.decode_ids(ids)
    return out


def error_rates(model: CtcModel, utts: D.Utterances, device) -> tuple[float, float]:
    """Corpus-level character and word error rates (torchmetrics), greedy CTC decoding."""
    from torchmetrics.functional.text import char_error_rate, word_error_rate

    hyps = transcribe(model, utts, device)
    refs = [" ".join(t.split()) for t in utts.targets]
    hyps = [" ".join(h.split()) for h in hyps]
    return float(char_error_rate(hyps, refs)), float(word_error_rate(hyps, refs))


def robustness(test_set: D.Utterances, samples: int, seed: int, score_fn, score: str) -> dict:
    """``score_fn`` on ``samples`` test utterances (spread evenly over the set) under every perturbation level
    (``quest_sdk.robustness``'s corruption vocabulary: per-family mean, error summed over levels for mCE, overall mean)."""
    base = test_set.subset(samples)

    def perturbed_score(family: str, level: float, family_seed: int) -> float:
        audio = []
        for i, x in enumerate(base.audio):
            others = ([base.audio[(i + k * len(base) // 5) % len(base)] for k in (1, 2, 3, 4)]
                      if family == "babble" else ())  # four utterances from elsewhere in the set
            audio.append(perturb(x, family, level, seed=family_seed + i, others=others))
        return score_fn(D.Utterances(audio, base.targets, base.speakers))

    scores = corruption_scores(PERTURBATIONS, perturbed_score, seed,
                               seed_of=lambda run_seed, f, _: run_seed * 100_000 + f * 1000)  # + the utterance
    return corruption_summary(scores, score=score)
