"""corruption_summary: the robustness vocabulary every task reports in (the leaderboard's mCE input)."""

import pytest

from quest_sdk.robustness import corruption_summary


def test_summary_averages_scores_and_sums_errors_over_severities():
    out = corruption_summary({"fog": [0.9, 0.7, 0.5], "noise": [0.6, 0.6, 0.0]})
    assert out["corruption_acc/fog"] == pytest.approx(0.7)
    assert out["corruption_error/fog"] == pytest.approx(0.1 + 0.3 + 0.5)
    assert out["corruption_error/noise"] == pytest.approx(1.8)
    assert out["corrupted_acc"] == pytest.approx(3.3 / 6)


def test_summary_names_other_scores_such_as_miou():
    out = corruption_summary({"fog": [0.4, 0.2]}, score="miou")
    assert set(out) == {"corruption_miou/fog", "corruption_error/fog", "corrupted_miou"}
    assert out["corrupted_miou"] == pytest.approx(0.3) and out["corruption_error/fog"] == pytest.approx(1.4)
