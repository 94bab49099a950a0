"""Speech data: synthesized keywords and sentences split by voice (default), shipped real recordings, and readers for
the real Speech Commands v2 and LibriSpeech folders (``--data-root``).

- Keywords: 30 of Speech Commands v2's 35 words, each spoken by espeak-ng (``quest_speech.synth``) in many voices,
  accents, rates and pitches, with 0–0.2 s of silence on either side.
- Sentences: 4–12-word sentences of real English Wikipedia text (shipped in ``quest_speech/data``, extracted from
  the WikiText-mini of the ``lm`` task: training sentences from its train split, test sentences from its test
  split), read by espeak-ng.
- Split by voice: the voice variants are grouped into families (``klatt``, ``klatt2``, ... -> ``klatt``) and every
  family is either train-only or test-only (a stable hash; about one family in five is held out). A random split
  would put the same synthetic voice on both sides and measure nothing.
- Real recordings (shipped, ``quest_speech/data``; built by ``scripts/build_real_recordings.py``): the ten digits
  spoken by one real speaker (Asterisk's prompts, 8 kHz) and five LibriVox read sentences with transcripts.

Generated sets are cached under ``~/.cache/quest-bench/speech`` (int16), keyed by their arguments. The real
datasets are read lazily (``AudioFiles``): a split is its file paths and lengths, each waveform read when it is used.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
import operator
import os
import re
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from quest_sdk.data import CACHE as SDK_CACHE
from quest_speech.synth import ACCENTS, SAMPLE_RATE, espeak_version, read_audio, synthesize, voice_variants

CACHE = SDK_CACHE / "speech"
SHIPPED = Path(__file__).parent / "data"
WORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go",
         "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "bed", "bird", "cat", "dog", "happy", "house", "marvin", "sheila", "tree", "wow")
CHARS = " '" + "abcdefghijklmnopqrstuvwxyz"  # CTC targets are 1..len(CHARS); 0 is the blank
SYNTH_VERSION = 1  # bump when synthesis changes (part of the cache key)


class AudioFiles(Sequence):
    """Audio files as a sequence of waveforms read when indexed (``read_audio``: float32 (T,) at 16 kHz), so that a
    real dataset's split is never held in memory; ``lengths`` (samples at 16 kHz) come from the files' headers."""

    def __init__(self, paths: list[Path], lengths: list[int] | None = None):
        self.paths = [Path(p) for p in paths]
        self.lengths = list(lengths) if lengths is not None else [resampled_length(p) for p in self.paths]
        if len(self.lengths) != len(self.paths):
            raise ValueError(f"{len(self.paths)} audio files but {len(self.lengths)} lengths")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"AudioFiles is indexed by one integer (a waveform), got {type(i).__name__}; "
                            "use select() for several") from None
        return read_audio(self.paths[i])

    def select(self, idx: list[int]) -> "AudioFiles":
        """The files ``idx``, still unread."""
        return AudioFiles([self.paths[i] for i in idx], [self.lengths[i] for i in idx])


def resampled_length(path: Path) -> int:
    """The samples of ``path`` at 16 kHz, from its header (torchaudio's resampling rounds the length up)."""
    info = sf.info(str(path))
    return info.frames if info.samplerate == SAMPLE_RATE else math.ceil(info.frames * SAMPLE_RATE / info.samplerate)


@dataclass
class Utterances:
    """Waveforms (float32, 16 kHz: tensors in memory, or ``AudioFiles`` read when used) with their targets (word
    index or transcript) and speaker (voice) ids."""

    audio: list[torch.Tensor] | AudioFiles
    targets: list
    speakers: list[str]

    def __len__(self) -> int:
        return len(self.audio)

    def lengths(self) -> list[int]:
        """Each waveform's samples (without reading files)."""
        return list(self.audio.lengths) if isinstance(self.audio, AudioFiles) else [len(a) for a in self.audio]

    def select(self, idx: list[int]) -> "Utterances":
        audio = self.audio.select(idx) if isinstance(self.audio, AudioFiles) else [self.audio[i] for i in idx]
        return Utterances(audio, [self.targets[i] for i in idx], [self.speakers[i] for i in idx])

    def hold_out_voices(self, fraction: float, seed: int = 0) -> tuple["Utterances", "Utterances | None"]:
        """(train, validation): every utterance of a seeded ``fraction`` of the voices (speakers) held out, so that
        validation, like the test split, is in voices the model did not train on. The same split for every run."""
        if not fraction:
            return self, None
        names = sorted(set(self.speakers))
        order = torch.randperm(len(names), generator=torch.Generator().manual_seed(seed)).tolist()
        held = {names[i] for i in order[: max(1, round(fraction * len(names)))]}
        val = [i for i, s in enumerate(self.speakers) if s in held]
        return self.select([i for i, s in enumerate(self.speakers) if s not in held]), self.select(val)

    def subset(self, n: int) -> "Utterances":
        """At most ``n`` utterances spread evenly over the set (the synthesized sets are ordered by word)."""
        if n >= len(self):
            return self
        return self.select(torch.linspace(0, len(self) - 1, n).round().long().tolist())


def voice_family(variant: str) -> str:
    return re.sub(r"\d+$", "", variant).lower()


def voices(split: str) -> list[str]:
    """The voice variants of a split: ``train`` or ``test`` (disjoint families)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    held_out = [v for v in voice_variants() if zlib.crc32(voice_family(v).encode()) % 5 == 0]
    return held_out if split == "test" else [v for v in voice_variants() if v not in held_out]


def _synthesize_all(texts: list[str], split: str, seed: int, pad_s: float) -> tuple[list[torch.Tensor], list[str]]:
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    pool = voices(split)
    jobs = []
    for text in texts:
        jobs.append((text, ACCENTS[rng.integers(len(ACCENTS))], pool[rng.integers(len(pool))],
                     int(rng.integers(130, 211)), int(rng.integers(25, 76)),
                     int(rng.uniform(0, pad_s) * SAMPLE_RATE), int(rng.uniform(0, pad_s) * SAMPLE_RATE)))

    def one(job):
        text, accent, variant, rate, pitch, before, after = job
        x = synthesize(text, accent, variant, rate, pitch)
        return torch.nn.functional.pad(x, (before, after))

    with ThreadPoolExecutor(max_workers=4) as pool_exec:
        audio = list(pool_exec.map(one, jobs))
    return audio, [job[2] for job in jobs]


def _cached(kind: str, args: dict, build) -> Utterances:
    """``build()``'s utterances, stored once as int16 and always returned from that stored form, so a run that
    synthesized the set and a run that read it from the cache see the same samples."""
    key = json.dumps({"kind": kind, "v": SYNTH_VERSION, "espeak-ng": espeak_version(), **args}, sort_keys=True)
    path = CACHE / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"
    if not path.exists():
        utts = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"audio": [(a.clamp(-1, 1) * 32767).round().short() for a in utts.audio],
                    "targets": utts.targets, "speakers": utts.speakers, "key": key}, tmp)
        tmp.replace(path)  # atomic: parallel runs never read a half-written file
    blob = torch.load(path, weights_only=True)
    return Utterances([a.float() / 32767 for a in blob["audio"]], blob["targets"], blob["speakers"])


def keywords(split: str, per_word: int, seed: int = 0) -> Utterances:
    """``per_word`` synthesized utterances of every word in ``WORDS``, voices from ``split``."""
    def build():
        labels = [i for i in range(len(WORDS)) for _ in range(per_word)]
        audio, speakers = _synthesize_all([WORDS[i] for i in labels], split, seed, pad_s=0.2)
        return Utterances(audio, labels, speakers)

    return _cached("keywords", {"split": split, "per_word": per_word, "seed": seed}, build)


def wiki_sentences(split: str) -> list[str]:
    """Sentences of 4-12 words of WikiText-mini made only of letters and apostrophes, lower-cased (shipped in
    ``data/wiki_sentences.<split>.txt.xz``; extracted from the WikiText-mini of the ``lm`` task, see
    data/README.md)."""
    name = {"train": "wiki_sentences.train.txt.xz", "test": "wiki_sentences.test.txt.xz"}[split]
    return lzma.decompress((resources.files("quest_speech") / "data" / name).read_bytes()).decode().splitlines()


def sentences(split: str, count: int, seed: int = 0) -> Utterances:
    """``count`` synthesized sentences (text from the matching WikiText-mini split), voices from ``split``."""
    def build():
        pool = wiki_sentences(split)
        rng = np.random.default_rng([seed, 2])
        texts = [pool[i] for i in rng.choice(len(pool), size=min(count, len(pool)), replace=False)]
        audio, speakers = _synthesize_all(texts, split, seed, pad_s=0.1)
        return Utterances(audio, texts, speakers)

    return _cached("sentences", {"split": split, "count": count, "seed": seed}, build)


def asterisk_digits() -> Utterances:
    """The ten digits ("zero".."nine") spoken by one real speaker (shipped; 8 kHz, resampled to 16 kHz)."""
    names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    audio = [read_audio(SHIPPED / "asterisk_digits" / f"{d}.wav") for d in range(10)]
    return Utterances(audio, [WORDS.index(n) for n in names], ["asterisk-allison"] * 10)


def librivox() -> Utterances:
    """Five real read sentences (LibriVox, 16 kHz) with their transcripts (shipped)."""
    rows = [line.split(" ", 1) for line in (SHIPPED / "librivox" / "transcripts.txt").read_text().splitlines()]
    audio = [read_audio(SHIPPED / "librivox" / f"{utt}.flac") for utt, _ in rows]
    return Utterances(audio, [text for _, text in rows], ["librivox-austen"] * len(rows))


def speech_commands(root: str | Path, subset: str, limit: int = 0) -> Utterances:
    """Speech Commands v2 (``<root>/SpeechCommands/speech_commands_v0.02/<word>/*.wav``) through
    ``torchaudio.datasets.SPEECHCOMMANDS`` (no download; audio read with soundfile when used), restricted to
    ``WORDS``."""
    from torchaudio.datasets import SPEECHCOMMANDS

    folder = Path(root) / "SpeechCommands" / "speech_commands_v0.02"
    if not folder.is_dir():
        raise FileNotFoundError(f"no Speech Commands v2 at {folder} (expected <word>/<speaker>_nohash_<n>.wav, "
                                "validation_list.txt, testing_list.txt)")
    dataset = SPEECHCOMMANDS(str(root), download=False, subset=subset)
    audio, labels, speakers = [], [], []
    for n in range(len(dataset)):
        relpath, _, label, speaker, _ = dataset.get_metadata(n)
        if label not in WORDS:
            continue
        audio.append(Path(dataset._archive) / relpath)
        labels.append(WORDS.index(label))
        speakers.append(speaker)
        if limit and len(audio) >= limit:
            break
    return Utterances(AudioFiles(audio), labels, speakers)


def librispeech(root: str | Path, url: str, limit: int = 0) -> Utterances:
    """A LibriSpeech split (``<root>/LibriSpeech/<url>/<speaker>/<chapter>/*.flac`` + ``*.trans.txt``) through
    ``torchaudio.datasets.LIBRISPEECH`` (no download; audio read with soundfile when used); transcripts
    lower-cased."""
    from torchaudio.datasets import LIBRISPEECH

    if not (Path(root) / "LibriSpeech" / url).is_dir():
        raise FileNotFoundError(f"no LibriSpeech split {url!r} under {Path(root) / 'LibriSpeech'}")
    dataset = LIBRISPEECH(str(root), url=url, download=False)
    n = len(dataset) if not limit else min(limit, len(dataset))
    audio, texts, speakers = [], [], []
    for i in range(n):
        relpath, _, transcript, speaker, _, _ = dataset.get_metadata(i)
        audio.append(Path(dataset._archive) / relpath)
        texts.append(transcript.lower())
        speakers.append(str(speaker))
    return Utterances(AudioFiles(audio), texts, speakers)


def encode_text(text: str) -> torch.Tensor:
    """Characters -> CTC target ids (1..28); characters outside ``CHARS`` are dropped."""
    return torch.tensor([CHARS.index(c) + 1 for c in text.lower() if c in CHARS], dtype=torch.long)


def decode_ids(ids: list[int]) -> str:
    return "".join(CHARS[i - 1] for i in ids if i > 0)
