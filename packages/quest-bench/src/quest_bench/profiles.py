"""Performance profiles across tasks (Dolan & Moré 2002, as MLCommons AlgoPerf uses them): per task, each
variant's score relative to the best variant's (a ratio ≥ 1, 1 = the best); a variant's profile ρ(τ) is the
fraction of tasks on which its ratio is at most τ. A variant without a finished run on a task has ratio ∞ there.
Ratios need positive scores, so a task whose scores are not all positive is left out (and named)."""

from __future__ import annotations

import math
from pathlib import Path

from quest_bench.figures import save_figure

TAUS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0)


def ratios(scores: dict[str, dict[str, float]], higher_is_better: dict[str, bool]) -> tuple[dict, list[str]]:
    """Per task, each variant's ratio to the best score (best/score where higher is better, score/best where lower
    is); returns the ratios and the tasks left out for non-positive scores."""
    out, skipped = {}, []
    for task, by_variant in scores.items():
        finite = [s for s in by_variant.values() if math.isfinite(s)]
        if not finite or any(s <= 0 for s in finite):
            skipped.append(task)
            continue
        top = max(finite) if higher_is_better[task] else min(finite)
        out[task] = {v: (top / s if higher_is_better[task] else s / top) if math.isfinite(s) else math.inf
                     for v, s in by_variant.items()}
    return out, skipped


def profile(task_ratios: dict[str, dict[str, float]], taus=TAUS) -> dict[str, list[float]]:
    """ρ_v(τ) for each τ: the fraction of tasks where variant v's ratio is ≤ τ (tasks a variant did not run count
    against it)."""
    variants = sorted({v for by_variant in task_ratios.values() for v in by_variant})
    n = len(task_ratios)
    return {v: [sum(r.get(v, math.inf) <= tau * (1 + 1e-12) for r in task_ratios.values()) / n for tau in taus]
            for v in variants}


def profile_figure(task_ratios: dict[str, dict[str, float]], path: Path, color, title: str) -> None:
    """ρ_v(τ) as step curves over τ from 1 to the largest finite ratio (at least 1.1)."""
    import matplotlib.pyplot as plt
    import numpy as np

    finite = [r for by_variant in task_ratios.values() for r in by_variant.values() if math.isfinite(r)]
    taus = np.linspace(1.0, max(1.1, max(finite, default=1.1) * 1.02), 400)
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    for v, rho in profile(task_ratios, taus).items():
        ax.step(taus, rho, where="post", label=v, color=color(v), lw=2.0 if v in ("quest", "softmax") else 1.2)
    ax.set_xlabel("τ (score within a factor τ of the best variant's)")
    ax.set_ylabel(f"fraction of the {len(task_ratios)} tasks")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
