"""The robustness vocabulary every task reports in, so the leaderboard can compute mCE relative to softmax."""

from __future__ import annotations

CORRUPTION_ACC = "corruption_acc/"  # per corruption: accuracy averaged over severities
CORRUPTION_ERROR = "corruption_error/"  # per corruption: error summed over severities (the leaderboard's mCE input)


def corruption_summary(acc_by_corruption: dict[str, list[float]]) -> dict[str, float]:
    """Per corruption, the accuracy averaged over severities and the error summed over them; plus
    ``corrupted_acc``, the accuracy averaged over every corruption and severity."""
    out = {}
    for name, per_severity in acc_by_corruption.items():
        out[f"{CORRUPTION_ACC}{name}"] = sum(per_severity) / len(per_severity)
        out[f"{CORRUPTION_ERROR}{name}"] = sum(1 - a for a in per_severity)
    every = [a for accs in acc_by_corruption.values() for a in accs]
    out["corrupted_acc"] = sum(every) / len(every)
    return out
