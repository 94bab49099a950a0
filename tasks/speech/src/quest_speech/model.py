"""Speech models around torchaudio's own Conformer, its self-attention swapped by ``quest_core.swap_attention``.

    waveform (B, T) --MelSpectrogram, log--> (B, n_mels, frames) --SpecAugment (training)--> per-utterance norm
      --Conv2dSubsampling (x4)--> (B, frames/4, d) --torchaudio.models.Conformer (key padding from lengths)-->
      keyword head: masked mean over time -> Linear -> word logits
      CTC head:     Linear -> character logits per frame (blank = 0), greedy decoding

Written here: the subsampler (torchaudio has none outside its RNN-T recipes) and the two heads.
"""

from __future__ import annotations

import torch
import torchaudio
from torch import nn

import quest_core
from quest_speech.synth import SAMPLE_RATE

HOP = 160  # 10 ms frames


def frames_of(samples_b: torch.Tensor) -> torch.Tensor:
    """Mel frames of waveforms with these lengths (``MelSpectrogram(center=True)``)."""
    return samples_b // HOP + 1


class FrontEnd(nn.Module):
    """Log-Mel features, SpecAugment masks in training, normalised per utterance over its valid frames."""

    def __init__(self, n_mels: int = 40, freq_mask: int = 8, time_mask: int = 10):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(SAMPLE_RATE, n_fft=400, hop_length=HOP, n_mels=n_mels)
        self.freq_mask = torchaudio.transforms.FrequencyMasking(freq_mask, iid_masks=True) if freq_mask else None
        self.time_mask = torchaudio.transforms.TimeMasking(time_mask, iid_masks=True) if time_mask else None

    def forward(self, wave_bt: torch.Tensor, lengths_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats_bft = (self.mel(wave_bt) + 1e-6).log()
        frames_b = frames_of(lengths_b)
        valid_b1t = (torch.arange(feats_bft.shape[-1], device=wave_bt.device) < frames_b[:, None])[:, None]
        count = valid_b1t.sum(-1, keepdim=True).clamp_min(1)
        mean = (feats_bft * valid_b1t).sum(-1, keepdim=True) / count
        std = (((feats_bft - mean) * valid_b1t).pow(2).sum(-1, keepdim=True) / count).sqrt().clamp_min(1e-3)
        feats_bft = ((feats_bft - mean) / std) * valid_b1t
        if self.training:
            if self.freq_mask is not None:
                feats_bft = self.freq_mask(feats_bft.unsqueeze(1)).squeeze(1)
            if self.time_mask is not None:
                feats_bft = self.time_mask(feats_bft.unsqueeze(1)).squeeze(1)
        return feats_bft, frames_b


class Conv2dSubsampling(nn.Module):
    """Two 3x3 stride-2 convolutions over (time, mel), then a projection to ``dim``: frames / 4."""

    def __init__(self, n_mels: int, dim: int, channels: int = 64):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, channels, 3, 2), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, 2), nn.ReLU())
        self.proj = nn.Linear(channels * (((n_mels - 1) // 2 - 1) // 2), dim)

    @staticmethod
    def out_lengths(frames_b: torch.Tensor) -> torch.Tensor:
        return ((frames_b - 3) // 2 + 1 - 3) // 2 + 1

    def forward(self, feats_bft: torch.Tensor, frames_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(feats_bft.transpose(1, 2).unsqueeze(1))  # (B, C, T', F')
        x_btd = self.proj(x.permute(0, 2, 1, 3).flatten(2))
        return x_btd, self.out_lengths(frames_b).clamp(min=1, max=x_btd.shape[1])


class SpeechEncoder(nn.Module):
    """Front end + subsampler + torchaudio Conformer (attention variant ``variant``)."""

    def __init__(self, variant: str, dim: int, num_heads: int, ffn_dim: int, num_layers: int, kernel_size: int,
                 n_mels: int = 40, dropout: float = 0.1, freq_mask: int = 8, time_mask: int = 10):
        super().__init__()
        self.front = FrontEnd(n_mels, freq_mask, time_mask)
        self.subsample = Conv2dSubsampling(n_mels, dim)
        self.conformer = torchaudio.models.Conformer(dim, num_heads, ffn_dim, num_layers, kernel_size, dropout)
        self.swap_report = quest_core.swap_attention(self.conformer, variant)

    def forward(self, wave_bt: torch.Tensor, lengths_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_btd, n_b = self.subsample(*self.front(wave_bt, lengths_b))
        return self.conformer(x_btd, n_b)


class KeywordModel(nn.Module):
    def __init__(self, encoder: SpeechEncoder, dim: int, num_classes: int):
        super().__init__()
        self.encoder, self.head = encoder, nn.Linear(dim, num_classes)

    def forward(self, wave_bt: torch.Tensor, lengths_b: torch.Tensor) -> torch.Tensor:
        x_btd, n_b = self.encoder(wave_bt, lengths_b)
        valid_bt1 = (torch.arange(x_btd.shape[1], device=x_btd.device) < n_b[:, None]).unsqueeze(-1)
        return self.head((x_btd * valid_bt1).sum(1) / n_b[:, None])


class CtcModel(nn.Module):
    def __init__(self, encoder: SpeechEncoder, dim: int, num_tokens: int):
        super().__init__()
        self.encoder, self.head = encoder, nn.Linear(dim, num_tokens + 1)  # + the blank (id 0)

    def forward(self, wave_bt: torch.Tensor, lengths_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_btd, n_b = self.encoder(wave_bt, lengths_b)
        return self.head(x_btd).log_softmax(-1), n_b


def greedy_ctc(log_probs_btv: torch.Tensor, lengths_b: torch.Tensor) -> list[list[int]]:
    """Best path: argmax per frame, merge repeats, drop blanks (0)."""
    out = []
    for best, n in zip(log_probs_btv.argmax(-1).tolist(), lengths_b.tolist()):
        ids, prev = [], 0
        for i in best[:n]:
            if i != prev and i != 0:
                ids.append(i)
            prev = i
        out.append(ids)
    return out
