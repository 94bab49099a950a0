"""The corruption loop and checks every task's robustness evaluation shares (quest_sdk.robustness)."""

import pytest

from quest_sdk.robustness import check_corruption, corruption_scores, corruption_summary


def test_every_corruption_and_severity_is_scored_in_order_with_its_own_seed():
    calls = []

    def score(name, severity, seed):
        calls.append((name, severity, seed))
        return {"a": 0.9, "b": 0.5}[name] - 0.1 * severity

    scores = corruption_scores({"a": (1, 2, 3), "b": (2, 5)}, score, seed=7)
    assert calls == [("a", 1, 7001), ("a", 2, 7002), ("a", 3, 7003), ("b", 2, 7012), ("b", 5, 7015)]
    assert scores.keys() == {"a", "b"} and scores["a"] == pytest.approx([0.8, 0.7, 0.6])
    assert scores["b"] == pytest.approx([0.3, 0.0])
    summary = corruption_summary(scores)
    assert summary["corruption_acc/a"] == pytest.approx(0.7) and summary["corruption_error/b"] == pytest.approx(1.7)


def test_a_task_may_seed_each_corruption_once_so_that_severities_nest():
    seeds = corruption_scores(dict.fromkeys(("x", "y"), (1, 2)), lambda name, s, seed: seed, seed=3,
                              seed_of=lambda run_seed, i, _: run_seed * 1000 + i)
    assert seeds == {"x": [3000, 3000], "y": [3001, 3001]}


def test_an_unknown_corruption_or_severity_names_the_valid_ones():
    check_corruption("fog", 2, ("fog", "snow"), (1, 2, 3))
    with pytest.raises(ValueError, match=r"^unknown corruption 'rain'; valid: fog, snow$"):
        check_corruption("rain", 2, ("fog", "snow"), (1, 2, 3))
    with pytest.raises(ValueError, match=r"^severity must be one of \(1, 2, 3\), got 4$"):
        check_corruption("fog", 4, ("fog", "snow"), (1, 2, 3))
