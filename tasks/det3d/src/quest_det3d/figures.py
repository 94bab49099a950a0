"""The prediction figure of a run: bird's-eye views of validation samples with the ground truth and the detections."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLOURS = plt.get_cmap("tab10").colors


def footprint(box: np.ndarray) -> np.ndarray:
    """The 5 corner points (closed polygon, the first two being the front corners) of a box row's footprint."""
    x, y, _, w, l, _, yaw = box[:7]
    c, s = np.cos(yaw), np.sin(yaw)
    corners = np.array([[l, w], [l, -w], [-l, -w], [-l, w], [l, w]]) / 2
    return corners @ np.array([[c, s], [-s, c]]) + [x, y]


def prediction_figure(samples, detections, classes: tuple[str, ...], extent: float, path: Path, title: str,
                      score_threshold: float = 0.3, count: int = 3) -> None:
    """``count`` validation samples spread over the split: points (grey), ground truth (black) and detections
    scoring above ``score_threshold`` (coloured by class, heading tick from the centre)."""
    picks = np.linspace(0, len(samples) - 1, count).round().astype(int)
    fig, axes = plt.subplots(1, count, figsize=(4.2 * count, 4.4), squeeze=False)
    for ax, i in zip(axes[0], picks):
        sample, (boxes, scores, labels) = samples[i], detections[i]
        ax.scatter(sample.points[::3, 0], sample.points[::3, 1], s=0.05, c="0.6", rasterized=True)
        for box in sample.boxes:
            ax.plot(*footprint(box).T, c="k", lw=0.8)
        for box, score, label in zip(boxes, scores, labels):
            if score >= score_threshold:
                corners = footprint(box)
                ax.plot(*corners.T, c=COLOURS[int(label) % 10], lw=1.0)
                ax.plot([box[0], corners[:2, 0].mean()], [box[1], corners[:2, 1].mean()], c=COLOURS[int(label) % 10], lw=1.0)
        ax.set_xlim(-extent, extent)
        ax.set_ylim(-extent, extent)
        ax.set_aspect("equal")
        ax.set_title(f"sample {i}", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [plt.Line2D([], [], c="k", label="ground truth")]
    handles += [plt.Line2D([], [], c=COLOURS[k % 10], label=name) for k, name in enumerate(classes)]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(f"{title} (detections with score >= {score_threshold})", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
