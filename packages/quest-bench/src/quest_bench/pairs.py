"""Paired tests between two variants of a suite, per level of a grid key and pooled (``quest-bench pairs``).

The leaderboard compares every variant with softmax. This answers a narrower question, e.g. "is quest more often
robust than qknorm at each weight decay?": runs of variants A and B are paired on (seed, every other override), so
each pair saw the same data, initial seed and hyper-parameters.

- A binary metric (every finished value 0 or 1) gets the exact McNemar test: a diverged or failed run counts as a
  failure (a result, never dropped), as in the leaderboard's success rates.
- A continuous metric gets the paired t test and the exact sign-flip p; a pair with a diverged or failed run has no
  value and is left out, and the table says how many pairs were.

Holm's correction runs over the per-level tests (the pooled test is a separate question and is not corrected).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from quest_bench.result import RunResult
from quest_bench.stats import (MIN_PAIRS_FOR_INTERVAL, format_p, holm, mcnemar_exact, monte_carlo_floor, paired_t,
                               sign_flip_p)
from quest_bench.store import is_finished

POOLED = "pooled"


@dataclass
class PairTest:
    level: str  # the grid key's value, or "pooled"
    n_pairs: int  # pairs with an outcome for both variants
    a_value: float  # A's success count (binary) or mean (continuous)
    b_value: float
    test: str  # "McNemar" or "paired t"
    p: float  # McNemar's, or the paired t test's (NaN below 5 pairs)
    p_holm: float = math.nan  # per-level tests only
    a_only: int = 0  # binary: pairs where only A succeeded
    b_only: int = 0
    mean_diff: float = math.nan  # continuous: mean of A - B and, from 5 pairs, its 95% t interval and t p
    diffs: tuple[float, ...] = ()  # continuous: the per-pair differences (shown below 5 pairs)
    ci_low: float = math.nan
    ci_high: float = math.nan
    sign_flip_p: float = math.nan
    left_out: int = 0  # continuous: pairs with a diverged or failed run


def outcome(r: RunResult, metric: str) -> float:
    """The run's value of ``metric``; NaN for a diverged or failed run."""
    return r.metrics.get(metric, math.nan) if r.status == "ok" and is_finished(r) else math.nan


def pair_key(r: RunResult, by: str | None) -> str:
    return json.dumps({"seed": r.seed, **{k: v for k, v in r.overrides.items() if k != by}}, sort_keys=True, default=str)


def is_binary(values: list[float]) -> bool:
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and all(v in (0.0, 1.0) for v in finite)


def level_of(r: RunResult, by: str | None) -> str:
    if by is None:
        return POOLED
    if by not in r.overrides:
        raise ValueError(f"run {r.run_id[:12]} ({r.variant}, seed {r.seed}) does not set {by!r}: the keys its runs "
                         f"set are {sorted(r.overrides) or 'none'}")
    return json.dumps(r.overrides[by])


def pair_tests(results: list[RunResult], a: str, b: str, metric: str, by: str | None = None) -> list[PairTest]:
    """Per level of ``by`` (in ascending order) and pooled: A against B on ``metric`` (see the module docstring).
    ``results`` are one task's runs at one preset; runs of other variants are ignored."""
    runs = {v: [r for r in results if r.variant == v] for v in (a, b)}
    for v, rs in runs.items():
        if not rs:
            raise ValueError(f"no runs of variant {v!r}; the runs hold {sorted({r.variant for r in results})}")
    values = {v: {(level_of(r, by), pair_key(r, by)): outcome(r, metric) for r in rs} for v, rs in runs.items()}
    every = [x for vals in values.values() for x in vals.values()]
    if not any(math.isfinite(x) for x in every):
        raise ValueError(f"no finished run has metric {metric!r}")
    binary = is_binary(every)
    levels = sorted({lvl for lvl, _ in values[a]} & {lvl for lvl, _ in values[b]}, key=json.loads) if by else []
    tests = [one_test(values[a], values[b], lvl, binary) for lvl in levels]
    adjusted = holm({t.level: t.p for t in tests})
    for t in tests:
        t.p_holm = adjusted[t.level]
    return tests + [one_test(values[a], values[b], None, binary)]


def one_test(a_vals: dict, b_vals: dict, level: str | None, binary: bool) -> PairTest:
    keys = sorted(k for k in set(a_vals) & set(b_vals) if level is None or k[0] == level)
    name = POOLED if level is None else level
    if binary:  # a missing value (diverged, failed) is a failure
        ours = {k: a_vals[k] == 1.0 for k in keys}
        base = {k: b_vals[k] == 1.0 for k in keys}
        m = mcnemar_exact(ours, base)
        return PairTest(name, len(keys), sum(ours.values()), sum(base.values()), "McNemar", m["p"],
                        a_only=m["ours_only"], b_only=m["base_only"])
    usable = [k for k in keys if math.isfinite(a_vals[k]) and math.isfinite(b_vals[k])]
    diffs = [a_vals[k] - b_vals[k] for k in usable]
    n = len(diffs)
    nan = {"p": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    t = paired_t(diffs) if n >= MIN_PAIRS_FOR_INTERVAL else nan  # fewer pairs: the differences and the exact test
    mean = lambda vals: sum(vals[k] for k in usable) / n if n else math.nan  # noqa: E731
    return PairTest(name, n, mean(a_vals), mean(b_vals), "paired t", t["p"], mean_diff=sum(diffs) / n if n else math.nan,
                    diffs=tuple(diffs), ci_low=t["ci_low"], ci_high=t["ci_high"],
                    sign_flip_p=sign_flip_p(diffs) if n else math.nan, left_out=len(keys) - n)


def markdown(tests: list[PairTest], a: str, b: str, metric: str, by: str | None) -> str:
    """The tests as a Markdown table with a one-paragraph legend."""
    binary = tests[-1].test == "McNemar"
    head = f"`{a}` against `{b}` on `{metric}`, paired on (seed, every other override)"
    if binary:
        legend = (f"{head}: successes k/n of each (a diverged or failed run counts as a failure), the pairs where only "
                  f"one succeeded, and the exact McNemar p.")
        rows = ["| " + (by or "level") + f" | n pairs | {a} | {b} | only {a} | only {b} | p | p (Holm) |",
                "|---|---|---|---|---|---|---|---|"]
        for t in tests:
            rows.append(f"| {t.level} | {t.n_pairs} | {t.a_value:.0f}/{t.n_pairs} | {t.b_value:.0f}/{t.n_pairs} | "
                        f"{t.a_only} | {t.b_only} | {format_p(t.p)} | {hp(t)} |")
    else:
        legend = (f"{head}: means over the pairs where both finished, the mean difference {a} − {b} with its 95% t "
                  f"interval and the paired t p (below {MIN_PAIRS_FOR_INTERVAL} pairs: the differences themselves and no "
                  "t test), and the exact sign-flip p.")
        rows = ["| " + (by or "level") + f" | n pairs | left out | {a} | {b} | Δ [95% CI] | p (t) | p (Holm) | "
                "p (sign-flip) |", "|---|---|---|---|---|---|---|---|---|"]
        for t in tests:
            interval = (f"{t.mean_diff:+.4g} [{t.ci_low:+.4g}, {t.ci_high:+.4g}]" if t.n_pairs >= MIN_PAIRS_FOR_INTERVAL
                        else f"{t.mean_diff:+.4g} (" + ", ".join(f"{d:+.4g}" for d in t.diffs) + ")" if t.n_pairs
                        else "–")
            rows.append(f"| {t.level} | {t.n_pairs} | {t.left_out} | {t.a_value:.4g} | {t.b_value:.4g} | {interval} | "
                        f"{format_p(t.p)} | {hp(t)} | {format_p(t.sign_flip_p, monte_carlo_floor(t.n_pairs))} |")
    note = "Holm's correction is over the per-level rows; the pooled row is not corrected." if by else ""
    return "\n".join([legend + (" " + note if note else ""), "", *rows, ""])


def report(results: list[RunResult], a: str, b: str, metric: str | None, by: str | None) -> str:
    """Per task and preset of ``results`` (a section each, headed "**task (preset)**"): A against B on ``metric``
    (default: the task's primary metric) per level of ``by`` and pooled, as a Markdown table with its legend."""
    sections = []
    for task, preset in sorted({(r.task, r.preset) for r in results}):
        runs = [r for r in results if (r.task, r.preset) == (task, preset)]
        name = metric or runs[0].primary_metric
        sections.append(f"**{task} ({preset})**\n\n{markdown(pair_tests(runs, a, b, name, by), a, b, name, by)}")
    return "\n".join(sections)


def hp(t: PairTest) -> str:
    return "–" if t.level == POOLED or not math.isfinite(t.p_holm) else format_p(t.p_holm)
