"""Saving the leaderboard's figures small enough to commit with a published suite."""

from __future__ import annotations

import io
from pathlib import Path

DPI = 110
COLORS = 256  # line plots use a few dozen colours; a 256-colour palette PNG is ~3x smaller than matplotlib's RGBA


def save_figure(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` as a palette PNG at :data:`DPI` and close it."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=COLORS).save(path, format="PNG", optimize=True)
