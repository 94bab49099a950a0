"""Equal tuning budgets (what MLCommons AlgoPerf calls external tuning): every variant searches the same grid of
hyper-parameters (a suite's ``tune`` keys); per variant, the cell with the best mean validation metric over its
seeds is chosen (ties: the first cell in grid order), and that cell's test metric is what is reported. A cell
counts only if all its seeds ran (as many runs as the variant's fullest cell) and finished; the default recipe (the
preset's own values) is reported beside, so that tuning gains show.

Tune, then confirm (a suite's ``confirm: {seeds: N}``, docs/statistics.md): the search above is stage 1; once every
stage-1 run has finished, stage 2 runs each variant's chosen cell again with N fresh seeds, disjoint from stage 1's
(``confirmation_specs``), so that the cell is chosen on one set of seeds and its test metric reported on another,
paired by seed with softmax at softmax's own chosen cell."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from quest_bench.conventions import directions
from quest_bench.result import RunResult
from quest_bench.stats import mean_std
from quest_bench.store import is_finished


TIE_TOLERANCE = 1e-12  # relative: validation means this close are a tie (broken by grid order)


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


def cell_key(cell: dict, keys: tuple[str, ...]) -> str:
    """The tune keys' values of a cell (or of a run's overrides) as one canonical string."""
    return json.dumps({k: cell.get(k) for k in keys}, sort_keys=True)


def ascending(cell: dict, keys: tuple[str, ...]) -> tuple:
    """A cell's sort key when no grid order is known: its values in ascending order, numbers before text."""
    return tuple((0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v)) for v in
                 (cell.get(k) for k in keys))


def grid_order(specs, keys: tuple[str, ...]) -> list[dict]:
    """The distinct cells of the tune keys in the order the specs list them (a suite's specs are in grid order:
    the grid's values as written, keys sorted)."""
    seen: dict[str, dict] = {}
    for spec in specs:
        seen.setdefault(cell_key(spec.overrides, keys), {k: spec.overrides.get(k) for k in keys})
    return list(seen.values())


def choices(runs: list[RunResult], keys: tuple[str, ...], validation_metric: str,
            order: list[dict] | None = None) -> list[Choice]:
    """A variant's runs grouped by the values of the tune keys, each with its mean validation metric, in grid order:
    ``order`` (cells as ``grid_order`` gives them) when known, else ascending values. Neither the order nor the
    means depend on the order of ``runs`` (each cell's runs are sorted by seed)."""
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for r in runs:
        groups[cell_key(r.overrides, keys)].append(r)
    out = []
    seeds = max((len(cell_runs) for cell_runs in groups.values()), default=0)  # a cell still running has fewer
    for cell, cell_runs in groups.items():
        cell_runs = sorted(cell_runs, key=lambda r: (r.seed, r.run_id))
        complete = len(cell_runs) == seeds and all(usable(r, validation_metric) for r in cell_runs)
        value = mean_std([r.metrics[validation_metric] for r in cell_runs])[0] if complete else math.nan
        out.append(Choice(json.loads(cell), cell_runs, value))
    rank = {cell_key(c, keys): i for i, c in enumerate(order or [])}
    return sorted(out, key=lambda c: (rank.get(cell_key(c.cell, keys), len(rank)), ascending(c.cell, keys)))


def best(options: list[Choice], higher_is_better: bool) -> Choice | None:
    """The choice with the best mean validation metric, ties going to the first in ``options`` (``choices`` lists
    them in grid order); means equal up to rounding (relative 1e-12: the same values summed in another order) tie.
    None if no cell had every seed finish."""
    ranked = [c for c in options if math.isfinite(c.validation)]
    if not ranked:
        return None
    top = (max if higher_is_better else min)(c.validation for c in ranked)
    return next(c for c in ranked if math.isclose(c.validation, top, rel_tol=TIE_TOLERANCE))


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


def preset_cell(runs: list[RunResult], keys: tuple[str, ...]) -> dict | None:
    """The preset's own values of the tune keys (its default recipe), as the runs stored them: an overridden key's
    from ``preset_values``, any other from the resolved ``config``. No task is built, so a report needs only the
    results. None when no run records every key (results written before ``preset_values`` existed)."""
    for r in runs:
        if all(k in r.preset_values or (k not in r.overrides and k in r.config) for k in keys):
            return {k: r.preset_values[k] if k in r.preset_values else r.config[k] for k in keys}
    return None


def at(options: list[Choice], cell: dict | None) -> Choice | None:
    """The choice at ``cell`` (numeric values compared as floats), if the search space contains it."""
    if cell is None:
        return None

    def same(a, b) -> bool:
        return float(a) == float(b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else a == b

    return next((c for c in options if all(same(c.cell.get(k), v) for k, v in cell.items())), None)


# ---- tune, then confirm ------------------------------------------------------------------------------------------

BASELINE = "softmax"  # stage 2 pairs every variant with it
MIN_STAGE_ONE_SEEDS = 3  # seeds per cell of the search
MIN_CONFIRM_SEEDS = 10  # fresh seeds per variant in stage 2 (the decision rule's n)


def confirm_seeds(where: str, confirm, seeds: list[int], tune: list, variants: list) -> tuple[int, ...]:
    """A suite's ``confirm`` mapping as stage 2's seeds. ``confirm: {seeds: N}`` takes the N integers after stage 1's
    largest seed; ``confirm: {seeds: [..]}`` lists them (none of stage 1's). Errors name what is wrong and what is
    valid."""
    if not isinstance(confirm, dict) or set(confirm) != {"seeds"}:
        raise ValueError(f"{where}: 'confirm' is a mapping with one key, 'seeds' (a count or a list of fresh seeds), "
                         f"e.g. confirm: {{seeds: {MIN_CONFIRM_SEEDS}}}; got {confirm!r}")
    if not tune:
        raise ValueError(f"{where}: 'confirm' needs 'tune' (stage 2 confirms the cell each variant chose in the search)")
    if BASELINE not in variants:
        raise ValueError(f"{where}: 'confirm' needs the variant {BASELINE!r} (stage 2 pairs every variant with it)")
    if len(set(seeds)) < MIN_STAGE_ONE_SEEDS:
        raise ValueError(f"{where}: 'confirm' needs at least {MIN_STAGE_ONE_SEEDS} stage-1 seeds per cell, got "
                         f"{len(set(seeds))}")
    given = confirm["seeds"]
    if isinstance(given, int) and not isinstance(given, bool):
        fresh = tuple(range(max(seeds) + 1, max(seeds) + 1 + given))
    elif isinstance(given, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in given):
        fresh = tuple(given)
    else:
        raise ValueError(f"{where}: confirm 'seeds' is a count or a list of integers >= 0, got {given!r}")
    if len(set(fresh)) != len(fresh) or len(fresh) < MIN_CONFIRM_SEEDS:
        raise ValueError(f"{where}: confirm 'seeds' needs at least {MIN_CONFIRM_SEEDS} distinct seeds (the decision "
                         f"rule's n), got {len(set(fresh))}")
    shared = sorted(set(fresh) & set(seeds))
    if shared:
        raise ValueError(f"{where}: confirm seeds {shared} are also stage-1 seeds; stage 2 needs fresh seeds")
    return fresh


def stage_one_choices(specs, results: dict[str, RunResult], keys: tuple[str, ...]):
    """Per (task, preset, variant) of stage-1 ``specs``: its Choices in grid order, built from the finished
    ``results`` (by run_id), and the template spec of each cell (for stage 2)."""
    groups: dict[tuple, list] = defaultdict(list)
    for spec in specs:
        groups[(spec.task, spec.preset, spec.variant)].append(spec)
    out = {}
    for group, group_specs in groups.items():
        runs = [results[s.run_id] for s in group_specs if s.run_id in results]
        validation = next((r.validation_metric for r in runs if r.validation_metric), "")
        templates = {cell_key(s.overrides, keys): s for s in reversed(group_specs)}
        options = choices(runs, keys, validation, grid_order(group_specs, keys)) if validation else []
        higher = directions(f"{group[0]} ({group[1]}) / {group[2]}", runs)[1] if runs else True  # all runs agree
        out[group] = (options, templates, higher, validation)
    return out


def confirmation_specs(suite, results: list[RunResult]) -> tuple[list, list[str]]:
    """Stage 2 of a confirming suite: per task, preset and variant, the cell chosen on validation in stage 1 (ties
    in grid order) with each of ``suite.confirm``'s fresh seeds, and notes on what cannot run yet or at all. Nothing
    until every stage-1 run has finished (ok with a finite primary metric, or diverged)."""
    from dataclasses import replace

    if not suite.confirm:
        return [], []
    finished = {r.run_id: r for r in results if is_finished(r)}
    missing = [s for s in suite.specs if s.run_id not in finished]
    if missing:
        return [], [f"stage 2 (confirm) waits for stage 1: {len(missing)} of {len(suite.specs)} runs not finished"]
    specs, notes = [], []
    for (task, preset, variant), (options, templates, higher, validation) in \
            stage_one_choices(suite.specs, finished, suite.tune).items():
        chosen = best(options, higher)
        if chosen is None:
            why = "reports no validation metric" if not validation else "has no cell where every seed finished"
            notes.append(f"stage 2: no run for {task}/{preset}/{variant}: stage 1 {why}")
            continue
        template = templates[cell_key(chosen.cell, suite.tune)]
        specs += [replace(template, seed=seed) for seed in suite.confirm]
    return specs, notes


def confirmed(choice: Choice | None, runs: list[RunResult], seeds: tuple[int, ...]) -> Choice | None:
    """Stage 2 of ``choice``: the variant's ``runs`` at its cell with the confirmation ``seeds`` (what a confirming
    suite reports), keeping the stage-1 validation mean that chose the cell."""
    if choice is None:
        return None
    cell = [r for r in runs if r.seed in seeds and at([Choice({k: r.overrides.get(k) for k in choice.cell})],
                                                      choice.cell)]
    return Choice(choice.cell, sorted(cell, key=lambda r: (r.seed, r.run_id)), choice.validation)
