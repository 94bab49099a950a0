"""The robustness vocabulary every task reports in, so the leaderboard can compute mCE relative to softmax."""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

CORRUPTION_ERROR = "corruption_error/"  # per corruption: error summed over severities (the leaderboard's mCE input)


def corruption_summary(score_by_corruption: dict[str, list[float]], score: str = "acc") -> dict[str, float]:
    """Per corruption, the score (accuracy, or another score in [0, 1] such as mIoU) averaged over severities as
    ``corruption_<score>/<name>`` and its error (1 - score) summed over them; plus ``corrupted_<score>``, the score
    averaged over every corruption and severity."""
    out = {}
    for name, per_severity in score_by_corruption.items():
        out[f"corruption_{score}/{name}"] = sum(per_severity) / len(per_severity)
        out[f"{CORRUPTION_ERROR}{name}"] = sum(1 - a for a in per_severity)
    every = [a for values in score_by_corruption.values() for a in values]
    out[f"corrupted_{score}"] = sum(every) / len(every)
    return out


def check_corruption(name: str, severity, corruptions: Collection[str], severities: Collection) -> None:
    """A ``ValueError`` naming the valid values when ``name`` is not one of ``corruptions`` or ``severity`` not one
    of ``severities``: the check every task's ``corrupt`` starts with."""
    if name not in corruptions:
        raise ValueError(f"unknown corruption {name!r}; valid: {', '.join(corruptions)}")
    if severity not in severities:
        raise ValueError(f"severity must be one of {tuple(severities)}, got {severity!r}")


def severity_seed(seed: int, index: int, severity: int) -> int:
    """The seed of corruption number ``index`` at ``severity`` in a run of ``seed``: distinct for every (corruption,
    severity) of a run, the same for every variant."""
    return seed * 1000 + 10 * index + severity


def corruption_scores(levels: Mapping[str, Sequence], score_fn: Callable[[str, object, int], float], seed: int,
                      seed_of: Callable[[int, int, object], int] = severity_seed) -> dict[str, list[float]]:
    """``score_fn(name, severity, corruption_seed)`` for every corruption (``levels``: name -> its severities, in
    order) and severity, with ``corruption_seed = seed_of(seed, index of the corruption, severity)``: the per-severity
    scores by corruption, ``corruption_summary``'s input."""
    return {name: [score_fn(name, s, seed_of(seed, i, s)) for s in severities]
            for i, (name, severities) in enumerate(levels.items())}
