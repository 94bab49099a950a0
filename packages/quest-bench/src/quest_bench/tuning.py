"""Equal tuning budgets (what MLCommons AlgoPerf calls external tuning): every variant searches the same grid of
hyper-parameters (a suite's ``tune`` keys); per variant, the cell with the best mean validation metric over its
seeds is chosen, and that cell's test metric is what is reported. A cell counts only if all its seeds ran (as many
runs as the variant's fullest cell) and finished;
the default recipe (the preset's own values) is reported beside, so that tuning gains show."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from quest_bench.result import RunResult
from quest_bench.stats import mean_std
from quest_bench.store import is_finished


@dataclass
class Choice:
    """One variant's runs at one point of the search space."""

    cell: dict  # the tune keys' values
    runs: list[RunResult] = field(default_factory=list)
    validation: float = math.nan  # mean validation metric over the cell's seeds (NaN unless every seed finished)

    def label(self) -> str:
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.cell.items())

    def by_seed(self, metric: str) -> dict[str, float]:
        """The finished runs' values of ``metric``, keyed by seed (for pairing across variants' cells)."""
        return {str(r.seed): r.metrics[metric] for r in self.runs if usable(r, metric)}

    def outcomes(self, metric: str) -> dict[str, float]:
        """Every run's value by seed, NaN for a diverged or failed one."""
        return {str(r.seed): r.metrics[metric] if usable(r, metric) else math.nan for r in self.runs}


def usable(r: RunResult, metric: str) -> bool:
    return r.status == "ok" and is_finished(r) and math.isfinite(r.metrics.get(metric, math.nan))


def choices(runs: list[RunResult], keys: tuple[str, ...], validation_metric: str) -> list[Choice]:
    """A variant's runs grouped by the values of the tune keys, each with its mean validation metric."""
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for r in runs:
        groups[json.dumps({k: r.overrides.get(k) for k in keys}, sort_keys=True)].append(r)
    out = []
    seeds = max((len(cell_runs) for cell_runs in groups.values()), default=0)  # a cell still running has fewer
    for cell, cell_runs in groups.items():
        complete = len(cell_runs) == seeds and all(usable(r, validation_metric) for r in cell_runs)
        value = mean_std([r.metrics[validation_metric] for r in cell_runs])[0] if complete else math.nan
        out.append(Choice(json.loads(cell), cell_runs, value))
    return out


def best(options: list[Choice], higher_is_better: bool) -> Choice | None:
    """The choice with the best mean validation metric (ties: the first in grid order); None if no cell had every
    seed finish."""
    ranked = [c for c in options if math.isfinite(c.validation)]
    if not ranked:
        return None
    return (max if higher_is_better else min)(ranked, key=lambda c: c.validation)


def edge_keys(options: list[Choice], choice: Choice) -> list[str]:
    """The numeric tune keys for which ``choice`` sits at the smallest or largest value searched: there the
    optimum may lie outside the search, which should then be widened."""
    edges = []
    for key, value in choice.cell.items():
        searched = {c.cell.get(key) for c in options}
        if (isinstance(value, (int, float)) and len(searched) > 1
                and all(isinstance(x, (int, float)) for x in searched) and value in (min(searched), max(searched))):
            edges.append(key)
    return edges


def default_cell(task: str, preset: str, keys: tuple[str, ...]) -> dict | None:
    """The preset's own values of the tune keys (its default recipe), or None if the task is not installed."""
    from quest_bench.registry import get_task

    try:
        config = get_task(task).make_config(preset, {})
    except ValueError:
        return None
    return {k: getattr(config, k) for k in keys}


def at(options: list[Choice], cell: dict | None) -> Choice | None:
    """The choice at ``cell`` (numeric values compared as floats), if the search space contains it."""
    if cell is None:
        return None

    def same(a, b) -> bool:
        return float(a) == float(b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else a == b

    return next((c for c in options if all(same(c.cell.get(k), v) for k, v in cell.items())), None)
