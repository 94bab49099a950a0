"""The robustness vocabulary every task reports in, so the leaderboard can compute mCE relative to softmax."""

from __future__ import annotations

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
