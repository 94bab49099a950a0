"""Build the real recordings shipped in quest_speech/data (run once; needs the two Debian packages' .deb files).

    apt-get download asterisk-core-sounds-en-wav pocketsphinx-testdata
    python tasks/speech/scripts/build_real_recordings.py asterisk-core-sounds-en-wav_*.deb pocketsphinx-testdata_*.deb

- ``asterisk_digits/{0..9}.wav``: the ten digit prompts recorded by Allison Smith for Asterisk (8 kHz, 16-bit,
  copied unchanged; CC-BY-SA-3.0). One real speaker saying ten of the keyword vocabulary's words.
- ``librivox/*.flac`` + ``librivox/transcripts.txt``: five sentences of LibriVox's reading of Jane Austen's
  *Sense and Sensibility* (public domain) with their transcripts, from pocketsphinx's test data (BSD-2 packaging),
  converted from WAV to FLAC (lossless) to halve their size.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import soundfile as sf

OUT = Path(__file__).resolve().parents[1] / "src" / "quest_speech" / "data"


def main(debs: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        digits = Path(tmp) / "usr/share/asterisk/sounds/en_US_f_Allison/digits"
        (OUT / "asterisk_digits").mkdir(parents=True, exist_ok=True)
        for d in range(10):
            shutil.copy(digits / f"{d}.wav", OUT / "asterisk_digits" / f"{d}.wav")
        librivox = Path(tmp) / "usr/share/pocketsphinx/test/data/librivox"
        (OUT / "librivox").mkdir(parents=True, exist_ok=True)
        lines = []
        for line in (librivox / "transcription").read_text().splitlines():
            m = re.match(r"<s> (.*) </s> \((.*)\)", line.strip())
            text, utt = m.group(1).strip(), m.group(2)
            audio, rate = sf.read(librivox / f"{utt}.wav", dtype="int16")
            sf.write(OUT / "librivox" / f"{utt}.flac", audio, rate)
            lines.append(f"{utt} {text}")
        (OUT / "librivox" / "transcripts.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
