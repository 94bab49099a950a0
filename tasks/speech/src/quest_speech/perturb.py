"""Acoustic perturbations for robustness evaluation, on 16 kHz float waveforms, deterministic given a seed.

| family | levels                     | what                                                                    |
|--------|----------------------------|-------------------------------------------------------------------------|
| white  | SNR 20, 10, 5, 0 dB        | additive Gaussian noise                                                 |
| babble | SNR 20, 10, 5, 0 dB        | additive sum of four other test utterances (other voices and texts)     |
| speed  | 0.9x, 1.1x                 | resampling: tempo and pitch change together (sox ``speed``, Kaldi recipes) |
| pitch  | -2, +2 semitones           | ``torchaudio.functional.pitch_shift`` (phase vocoder), tempo kept       |
| reverb | RT60 0.3 s, 0.6 s          | convolution with a synthetic room impulse response (exponentially decaying noise) |
"""

from __future__ import annotations

import torch
import torchaudio.functional as AF

from quest_speech.synth import SAMPLE_RATE

PERTURBATIONS: dict[str, tuple] = {
    "white": (20, 10, 5, 0),
    "babble": (20, 10, 5, 0),
    "speed": (0.9, 1.1),
    "pitch": (-2, 2),
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
        return AF.pitch_shift(x, SAMPLE_RATE, level)
    wet = AF.fftconvolve(x, room_impulse(level, gen))[: len(x)]
    return wet * (_power(x) / _power(wet)).sqrt()
