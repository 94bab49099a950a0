"""Figures are written as palette PNGs: the same picture, a fraction of the bytes."""

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from quest_bench.figures import DPI, save_figure  # noqa: E402


def curves_figure():
    fig, axes = plt.subplots(1, 3, figsize=(10, 3))
    steps = np.arange(200)
    for ax, scale in zip(axes, (1.0, 2.0, 3.0)):
        for variant, color in (("softmax", "C0"), ("quest", "C1"), ("qknorm", "C2")):
            ax.plot(steps, np.exp(-steps / (50 * scale)) + 0.02 * np.sin(steps / 3), color=color, label=variant)
        ax.legend()
    return fig


def test_a_saved_figure_is_a_palette_png_of_the_same_picture_and_smaller(tmp_path):
    fig = curves_figure()
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=DPI)
    path = tmp_path / "curves.png"
    save_figure(fig, path)

    assert not plt.get_fignums(), "save_figure closes the figure"
    with Image.open(path) as saved, Image.open(rgba) as reference:
        assert saved.mode == "P" and saved.size == reference.size
        diff = np.abs(np.asarray(saved.convert("RGB"), dtype=int) - np.asarray(reference.convert("RGB"), dtype=int))
    assert diff.mean() < 2.0, f"the palette changed the picture (mean abs difference {diff.mean():.2f} of 255)"
    assert path.stat().st_size < 0.6 * len(rgba.getvalue())
