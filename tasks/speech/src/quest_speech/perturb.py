"""Acoustic perturbations for robustness evaluation, on 16 kHz float waveforms, deterministic given a seed.

| family | levels                     | what                                                                    |
|--------|----------------------------|-------------------------------------------------------------------------|
| white  | SNR 20, 10, 5, 0 dB        | additive Gaussian noise                                                 |
| babble | SNR 20, 10, 5, 0 dB        | additive sum of four other test utterances (other voices and texts)     |
| speed  | 0.9x, 1.1x                 | resampling: tempo and pitch change together (sox ``speed``, Kaldi recipes) |
| pitch  | x8/9, x9/8 (about ±2 semitones) | phase-vocoder time stretch, then resampling by the same ratio |
| reverb | RT60 0.3 s, 0.6 s          | convolution with a synthetic room impulse response (decaying noise)     |
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
import torchaudio.functional as AF

from quest_speech.synth import SAMPLE_RATE

PERTURBATIONS: dict[str, tuple] = {
    "white": (20, 10, 5, 0),
    "babble": (20, 10, 5, 0),
    "speed": (0.9, 1.1),
    "pitch": (8 / 9, 9 / 8),  # ratios of small integers: torchaudio's pitch_shift(n_steps=2) resamples 16000 ->
    # 14254 Hz, whose sinc kernel made it take ~9 s per one-second clip
    "reverb": (0.3, 0.6),
}


def _power(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean().clamp_min(1e-10)


def add_at_snr(x: torch.Tensor, noise: torch.Tensor, snr_db: float) -> torch.Tensor:
    """``x`` plus ``noise`` scaled so that power(x) / power(noise) is ``snr_db``."""
    scale = (_power(x) / (_power(noise) * 10 ** (snr_db / 10))).sqrt()
    return x + scale * noise


def babble_noise(others: list[torch.Tensor], length: int) -> torch.Tensor:
    """The sum of other utterances, each looped/cut to ``length`` samples and brought to the same power."""
    out = torch.zeros(length)
    for o in others:
        o = o.repeat(length // max(1, len(o)) + 1)[:length]
        out += o / _power(o).sqrt()
    return out


def room_impulse(rt60: float, gen: torch.Generator) -> torch.Tensor:
    """A synthetic impulse response: a direct path then noise decaying by 60 dB over ``rt60`` seconds."""
    t = torch.arange(int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    tail = torch.randn(len(t), generator=gen) * torch.exp(-6.908 * t / rt60)  # ln(1000) = 6.908: -60 dB at rt60
    tail[0] = 0
    rir = 0.3 * tail / tail.abs().max()
    rir[0] = 1.0
    return rir


def pitch_shift(x: torch.Tensor, ratio: float, n_fft: int = 512, hop: int = 128) -> torch.Tensor:
    """Raise the pitch by ``ratio`` (a ratio of small integers) and keep the duration: stretch the time axis by
    ``ratio`` with torchaudio's phase vocoder, then resample it back to the original length."""
    frac = Fraction(ratio).limit_denominator(16)
    window = torch.hann_window(n_fft)
    spec = torch.stft(x, n_fft, hop, window=window, return_complex=True)
    advance = torch.linspace(0, math.pi * hop, spec.shape[0])[:, None]
    stretched = AF.phase_vocoder(spec, 1 / float(frac), advance)
    y = torch.istft(stretched, n_fft, hop, window=window, length=round(len(x) * float(frac)))
    return AF.resample(y, frac.numerator, frac.denominator)[: len(x)]


def perturb(x: torch.Tensor, family: str, level: float, seed: int, others: list[torch.Tensor] = ()) -> torch.Tensor:
    """One perturbed waveform; ``others`` (utterances other than ``x``) are needed for ``babble``."""
    if family not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {family!r}; valid: {', '.join(PERTURBATIONS)}")
    gen = torch.Generator().manual_seed(seed)
    if family == "white":
        return add_at_snr(x, torch.randn(len(x), generator=gen), level)
    if family == "babble":
        if not others:
            raise ValueError("babble needs other utterances to mix in")
        return add_at_snr(x, babble_noise(list(others), len(x)), level)
    if family == "speed":
        return AF.resample(x, round(SAMPLE_RATE * level), SAMPLE_RATE)
    if family == "pitch":
        return pitch_shift(x, level)
    wet = AF.fftconvolve(x, room_impulse(level, gen))[: len(x)]
    return wet * (_power(x) / _power(wet)).sqrt()
