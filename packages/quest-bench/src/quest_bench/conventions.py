"""A board's task conventions, read from its runs' records: which training curves to plot (and which on a log axis),
the stability-margin axis and metric, what "stable" means for the task, the robustness metric, and the metric
directions. Each result stores its task's conventions (``Task.conventions``); a record written before that field
existed gets the installed task class's declaration (or the SDK's defaults when the task is not installed), and the
leaderboard's provenance says so. When runs of one board disagree, the board says so: a conflicting metric direction
is an error (no number could be read either way); any other conflict is a visible note, and the report falls back
to what every run agrees on."""

from __future__ import annotations

from dataclasses import dataclass, field

from quest_bench.result import RunResult

FIELDS = ("curves", "log_curves", "stability_axis", "stability_metric", "stability_note", "robustness_metric")
LISTS = ("curves", "log_curves")
DECLARED, DEFAULTS = "the installed task's declaration", "the SDK's defaults (the task is not installed)"


def declared(task: str) -> tuple[dict, str]:
    """The conventions the installed task class declares, and where they come from (its declaration, or the SDK's
    defaults when no task of that name is installed)."""
    from quest_bench.registry import get_task
    from quest_sdk.task import Task

    try:
        return type(get_task(task)).conventions(), DECLARED
    except ValueError:
        return Task.conventions(), DEFAULTS


@dataclass
class Conventions:
    """What one board's runs say about how to read them (``of_runs``)."""

    curves: list[str] = field(default_factory=list)
    log_curves: list[str] = field(default_factory=list)
    stability_axis: str = ""  # "" when the runs disagree: no margin section
    stability_metric: str = ""
    stability_note: str = ""
    robustness_metric: str = ""  # "" when none (or the runs disagree)
    primary: str = ""
    higher: bool = True
    directions: dict[str, bool] = field(default_factory=dict)  # primary first, then the extras in record order
    undeclared: int = 0  # runs whose records hold no conventions
    source: str = ""  # where the undeclared runs' conventions come from
    conflicts: dict[str, list] = field(default_factory=dict)  # field -> the distinct values the runs hold


def of_runs(title: str, runs: list[RunResult]) -> Conventions:
    """The conventions of a board's runs. Runs that disagree on the primary metric or on a metric's direction are a
    ValueError naming the board, the metric and two runs that differ; other disagreements are kept in
    ``conflicts``: the curves plotted are every run's, a log axis only where every run asks for one, and no margin
    section, stability note or robustness metric is used."""
    from quest_sdk.task import Task

    fallback, source = declared(runs[0].task)
    installed = source == DECLARED
    values: dict[str, list] = {k: [] for k in FIELDS}
    undeclared = 0
    for r in runs:
        stored = r.conventions  # its types checked on read (result.check_record)
        undeclared += not stored
        # a record without conventions of a task that is not installed: its own metrics name its robustness metric
        own = fallback if stored or installed else {
            **fallback, "robustness_metric": Task.default_robustness(r.metric_directions)}
        for key in FIELDS:
            value = stored.get(key, fallback[key]) if stored else own[key]
            value = tuple(value) if key in LISTS else value
            if value not in values[key]:
                values[key].append(value)
    out = Conventions(undeclared=undeclared, source=source if undeclared else "")
    out.conflicts = {k: [list(v) if k in LISTS else v for v in vs] for k, vs in values.items() if len(vs) > 1}
    out.curves = list(dict.fromkeys(k for v in values["curves"] for k in v))
    out.log_curves = [k for k in out.curves if all(k in v for v in values["log_curves"])]
    for key in ("stability_axis", "stability_metric", "stability_note", "robustness_metric"):
        setattr(out, key, values[key][0] if len(values[key]) == 1 else "")
    out.primary, out.higher, out.directions = directions(title, runs)
    return out


def directions(title: str, runs: list[RunResult]) -> tuple[str, bool, dict[str, bool]]:
    """The board's primary metric, its direction and every metric's direction, checked to agree over the runs."""
    primaries = {r.primary_metric: r for r in runs if r.primary_metric}
    if len(primaries) > 1:
        (a, ra), (b, rb) = list(primaries.items())[:2]
        raise ValueError(f"runs of {title} name different primary metrics: {a!r} (run {ra.run_id[:12]}) and {b!r} "
                         f"(run {rb.run_id[:12]}); they come from different task versions or datasets: give them "
                         "separate suites, or leave the older runs out")
    primary = next(iter(primaries), "")
    seen: dict[str, tuple[bool, RunResult]] = {}
    for r in runs:
        said = ({primary: r.higher_is_better} if r.primary_metric else {}) | r.metric_directions
        for metric, higher in said.items():
            first = seen.setdefault(metric, (higher, r))
            if first[0] != higher:
                raise ValueError(
                    f"runs of {title} disagree on whether higher is better for {metric!r}: run {first[1].run_id[:12]} "
                    f"says {'higher' if first[0] else 'lower'}, run {r.run_id[:12]} {'higher' if higher else 'lower'}; "
                    "they come from different task versions: leave the older runs out (a suite counts only the runs "
                    "of its current definition)")
    higher = seen[primary][0] if primary in seen else True
    return primary, higher, {primary: higher, **{m: h for m, (h, _) in seen.items() if m != primary}}
