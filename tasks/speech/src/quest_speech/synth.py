"""Speech synthesis with espeak-ng (Debian package ``espeak-ng``; ``make setup`` installs it when run as root).

A *voice* is one of espeak-ng's ~100 voice variants (``!v/...``: formant sets, pitch ranges, breathiness, from
"f3" to "grandpa"); every utterance also draws an English accent (7 of espeak-ng's own, from en-us to en-029),
a speaking rate and a base pitch. The train/test split of the default datasets is by voice variant.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16_000
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029")


def espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise RuntimeError(
            "the speech tasks' default data is synthesized with espeak-ng, which is not installed. Install it with "
            "`sudo apt-get install espeak-ng` (Debian/Ubuntu; `make setup` does this when run as root), or use real "
            "data from --data-root (--set dataset=speechcommands / librispeech)."
        )
    return path


@functools.cache
def espeak_version() -> str:
    """``espeak-ng --version``'s version number: part of every cache key and data revision (the voices, and
    therefore the split and the audio, come from the installed espeak-ng)."""
    out = subprocess.run([espeak(), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("text-to-speech:")[-1].split()[0] if "text-to-speech:" in out else out.strip()


@functools.cache
def voice_variants() -> tuple[str, ...]:
    """espeak-ng's voice variant names (the ``<name>`` of ``-v en-us+<name>``), sorted."""
    out = subprocess.run([espeak(), "--voices=variant"], capture_output=True, text=True, check=True).stdout
    names = [line.split("!v/", 1)[1].split("  ")[0].strip() for line in out.splitlines() if "!v/" in line]
    return tuple(sorted({n for n in names if " " not in n}, key=str.lower))  # ("Mr serious" cannot be named in -v)


def synthesize(text: str, accent: str, variant: str, rate_wpm: int, pitch: int) -> torch.Tensor:
    """One utterance as a float32 (T,) waveform at 16 kHz."""
    done = subprocess.run(
        [espeak(), "-v", f"{accent}+{variant}", "-s", str(rate_wpm), "-p", str(pitch), "--stdout", text],
        capture_output=True,
    )
    if done.returncode != 0 or len(done.stdout) <= 44:
        raise RuntimeError(f"espeak-ng failed for voice {accent}+{variant} on {text!r} (exit {done.returncode}): "
                           f"{done.stderr.decode(errors='replace').strip()}")
    wav = done.stdout
    # espeak-ng streams its WAV with placeholder sizes in the header: read the samples after the 44-byte header.
    rate = int.from_bytes(wav[24:28], "little")
    audio = np.frombuffer(wav[44: 44 + (len(wav) - 44) // 2 * 2], dtype="<i2").astype(np.float32) / 32768
    return AF.resample(torch.from_numpy(audio), rate, SAMPLE_RATE)


def read_audio(path, target_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """A WAV/FLAC file (any rate; first channel) as a float32 (T,) waveform at ``target_rate``, via soundfile."""
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    x = torch.from_numpy(np.ascontiguousarray(audio[:, 0]))
    return x if rate == target_rate else AF.resample(x, rate, target_rate)
