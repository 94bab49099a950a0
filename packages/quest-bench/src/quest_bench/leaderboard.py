"""The leaderboard of one suite: Markdown (README.md) and a self-contained index.html with figures.

Per task (and preset): each variant's primary metric, mean ± std over its finished runs (seeds × grid cells; no std
for n < 2), the paired difference to ``softmax`` on the same seeds and overrides (the per-pair differences and an
exact sign-flip p-value for n < 5, a t 95% interval for n ≥ 5; Holm-corrected over the task's variants), for a
binary primary metric the success rate with a Wilson interval and an exact McNemar test, the task's extra metrics,
divergence and failure counts, and (for suites with a grid) the primary metric per grid cell. Across tasks: each
variant's mean win rate, a win being a significantly better result on paired runs (exact sign test, Holm), over the
primary metrics and separately over each task's declared robustness metric; not shown while any cell has fewer
than 2 runs (a banner names them). Figures: per-task bars with t 95% intervals (n ≥ 2) and the training curves the
task declares.

Stability margin: when a suite sweeps a task's stability axis (its declared grid key, e.g. the learning rate; at
least 3 values) and its runs report the task's stability metric (1 = trained stably, by the task's definition),
each variant's margin is the largest value at which it, and every smaller value of the grid, was stable on every
seed; plus a plot of the primary metric against that value.

How a task's results are read (curves, log axes, stability axis and metric, robustness metric, metric directions)
comes from its runs' records (``quest_bench.conventions``), never from the task's name. Sections return tables
(``quest_bench.report_tables``); one renderer writes them as Markdown, HTML, CSV and JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from quest_bench import conventions, meta, profiles, tuning  # noqa: E402
from quest_bench.figures import save_figure  # noqa: E402
from quest_bench.report_tables import (CSP, FIGURE, LINK, SAFE_TARGET, Num, Page, Table, Text,  # noqa: E402,F401
                                       clean, html_page, inline, link_target, md, md_code, safe_link, write_data)
from quest_bench.result import RunResult  # noqa: E402
from quest_sdk.robustness import CORRUPTION_ERROR  # noqa: E402
from quest_sdk.task import Task  # noqa: E402
from quest_bench.stats import (format_p, holm, mcnemar_exact, mean_std, mean_win_rate,  # noqa: E402
                               min_pairs_for_significance, paired_difference, t_interval, wilson_interval)
from quest_bench.runs import ADHOC, RunSet, suite_runs  # noqa: E402
from quest_bench.spec import slug  # noqa: E402
from quest_bench.store import Store, is_finished, unusable_reason  # noqa: E402

BASELINE = "softmax"
PALETTE = ("#7f7f7f", "#d9622b", "#3b6fb6", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#1f77b4", "#ff9896", "#98df8a")  # softmax grey, quest orange, then one colour per registered variant

# Untrusted text: every value read from a run (task, variant, overrides, metric names, environment, file names) is
# data. It enters prose only through md() or md_code() and tables only as a cell (quest_bench.report_tables), which
# leave no Markdown or HTML syntax in it; the HTML page links only to relative paths (after normalisation) and
# embeds only the figures this module generated.


def plot_text(value) -> str:
    """Untrusted text for a matplotlib label (no mathtext)."""
    return clean(value).replace("$", r"\$")


def variant_color(variant: str) -> str:
    """The colour of a variant in every figure of every leaderboard (by its place in quest_core's registry)."""
    import quest_core

    names = [BASELINE, "quest", *(v for v in quest_core.list_variants() if v not in (BASELINE, "quest"))]
    return PALETTE[names.index(variant) % len(PALETTE)] if variant in names else "#000000"


def fmt(x: float, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def pair_key(r: RunResult) -> str:
    return json.dumps([r.seed, r.overrides], sort_keys=True)


def variant_order(variants) -> list[str]:
    import quest_core

    known = quest_core.list_variants()
    return sorted(variants, key=lambda v: (known.index(v) if v in known else len(known), v))


def run_figure_path(run_id: str, stem: str) -> Path:
    """Where the leaderboard folder keeps its copy of a run's figure ``<stem>.png``."""
    return Path("run-figures") / f"{run_id[:12]}-{slug(stem)}.png"


class TaskBoard:
    """Everything the leaderboard says about one (task, preset)."""

    def __init__(self, task: str, preset: str, runs: list[RunResult], config: str = ""):
        self.task, self.preset, self.runs = task, preset, runs
        self.config = config  # the overrides every run shares, when a board groups by config (ad-hoc runs)
        self.conventions = conventions.of_runs(self.title, runs)  # declared by the task, stored with each run
        self.primary, self.higher = self.conventions.primary, self.conventions.higher
        self.directions = self.conventions.directions
        self.by_variant: dict[str, list[RunResult]] = defaultdict(list)
        for r in runs:
            self.by_variant[r.variant].append(r)
        self.variants = variant_order(self.by_variant)
        for v, vruns in self.by_variant.items():
            duplicates = len(vruns) - len({pair_key(r) for r in vruns})
            if duplicates:
                print(f"warning: {self.title} / {v}: {duplicates} runs repeat another run's seed and overrides (other "
                      "code versions?); only one of each pair counts in paired statistics", file=sys.stderr)

    @property
    def title(self) -> str:
        return f"{self.task} ({self.preset})" + (f" [{self.config}]" if self.config else "")

    def ok(self, variant: str) -> list[RunResult]:
        """Finished runs with a finite primary metric (the ones the numbers are computed from)."""
        return [r for r in self.by_variant[variant] if r.status == "ok" and is_finished(r)]

    def values(self, variant: str, metric: str) -> dict[str, float]:
        return {pair_key(r): r.metrics[metric] for r in self.ok(variant) if metric in r.metrics}

    @property
    def binary(self) -> bool:
        """Whether the primary metric is a 0/1 outcome (then rates, Wilson intervals and McNemar tests are used)."""
        return self.is_binary(self.primary)

    def is_binary(self, metric: str) -> bool:
        values = [r.metrics[metric] for r in self.runs if r.status == "ok" and metric in r.metrics]
        return bool(values) and all(v in (0.0, 1.0) for v in values)

    def successes(self, variant: str, metric: str) -> dict[str, bool]:
        """A binary metric per pair key; diverged and failed runs count as failures."""
        return {k: v == 1.0 for k, v in self.outcomes(variant, metric).items()}

    def in_cell(self, cell: str) -> "TaskBoard":
        """The board of one grid cell's runs (its overrides as JSON, as ``grid_cells`` gives them)."""
        return TaskBoard(self.task, self.preset,
                         [r for r in self.runs if json.dumps(r.overrides, sort_keys=True) == cell])

    def outcomes(self, variant: str, metric: str) -> dict[str, float]:
        """Every run's value by pair key, NaN for a diverged or failed run (a result: it ranks worst, counts as a
        failure in success rates)."""
        return {pair_key(r): (r.metrics.get(metric, math.nan) if r.status == "ok" and is_finished(r) else math.nan)
                for r in self.by_variant[variant]}

    def row(self, variant: str) -> dict:
        runs = self.by_variant[variant]
        vals = list(self.values(variant, self.primary).values())
        mean, std = mean_std(vals)
        lo, hi = t_interval(vals)
        row = {"variant": variant, "n": len(vals), "mean": mean, "std": std, "ci": (lo, hi),
               "diverged": sum(r.status == "diverged" for r in runs), "failed": sum(r.status == "failed" for r in runs),
               "extra": {m: mean_std(list(self.values(variant, m).values())) for m in self.directions if m != self.primary}}
        if self.binary:  # success rate over every run (diverged and failed runs are failures)
            successes = {k: v == 1.0 for k, v in self.outcomes(variant, self.primary).items()}
            row["rate"] = (sum(successes.values()), len(successes), wilson_interval(sum(successes.values()),
                                                                                     len(successes)))
        if variant != BASELINE and BASELINE in self.by_variant:
            row["delta"] = paired_difference(self.values(variant, self.primary), self.values(BASELINE, self.primary))
            if self.binary:  # over every pair, diverged and failed runs counting as failures
                base = {k: v == 1.0 for k, v in self.outcomes(BASELINE, self.primary).items()}
                m = mcnemar_exact(successes, base)
                n = m["n_pairs"]
                row["delta"] = {"n_pairs": n, "diffs": [], "mcnemar": m, "p": m["p"],
                                "mean": (m["ours_only"] - m["base_only"]) / n if n else math.nan}
        return row

    def n_outcomes(self, variant: str) -> int:
        """Runs with an outcome: finished with a usable primary metric, or diverged (a result too)."""
        return sum(r.status == "diverged" or (r.status == "ok" and is_finished(r)) for r in self.by_variant[variant])

    def rows(self) -> list[dict]:
        """Every variant's row, with Holm-adjusted p-values (``p_holm``) over the variants compared to softmax."""
        rows = [self.row(v) for v in self.variants]
        adjusted = holm({r["variant"]: r["delta"]["p"] for r in rows if "delta" in r and r["delta"]["n_pairs"]})
        for r in rows:
            if "delta" in r:
                r["delta"]["p_holm"] = adjusted.get(r["variant"], math.nan)
        return rows

    def robustness_metric(self) -> str | None:
        """The task's robustness metric for the cross-task win rate (its declared convention), if any."""
        metric = self.conventions.robustness_metric
        return metric if metric in self.directions else None

    def corruptions(self) -> list[str]:
        names = {m for r in self.runs for m in r.metrics if m.startswith(CORRUPTION_ERROR)}
        return sorted(n[len(CORRUPTION_ERROR):] for n in names)

    def mce(self, variant: str) -> dict[str, float]:
        """Mean corruption error (Hendrycks & Dietterich 2019) relative to softmax, in %, per run (by pair key): per
        corruption, the run's error summed over severities divided by softmax's mean over its runs; then the mean
        over corruptions. softmax's own runs scatter around 100, which shows its seed noise; pairing a variant's
        runs with softmax's on the same seed then tests the difference."""
        base = {c: mean_std(list(self.values(BASELINE, CORRUPTION_ERROR + c).values()))[0] for c in self.corruptions()}
        out = {}
        for r in self.ok(variant):
            ratios = [r.metrics[CORRUPTION_ERROR + c] / b for c, b in base.items()
                      if CORRUPTION_ERROR + c in r.metrics and math.isfinite(b) and b > 0]
            if ratios:
                out[pair_key(r)] = 100 * sum(ratios) / len(ratios)
        return out

    def mce_cells(self, variant: str) -> tuple[Text, Text]:
        """The mCE column (mean ± std over runs, n) and its paired Δ vs softmax column."""
        values = self.mce(variant)
        mean, std = mean_std(list(values.values()))
        cell = Text(f"{mean_cell(mean, std, len(values), 1)} (n={len(values)})" if values else "—",
                    data={"mean": mean, "std": std, "n": len(values)} if values else None)
        if variant == BASELINE:
            return cell, Text("—")
        return cell, delta_cell(paired_difference(values, self.mce(BASELINE)), False)  # uncorrected

    def figure_links(self, run_folders: dict[str, Path], folder: Path) -> list[str]:
        """Markdown links to each variant's per-run figures (first finished run), copied into ``folder/run-figures``
        so that the leaderboard folder keeps working when copied elsewhere."""
        links = []
        for v in self.variants:
            runs = sorted(self.ok(v), key=lambda r: r.seed)
            pngs = sorted(run_folders[runs[0].run_id].glob("*.png")) if runs else []
            for png in pngs:
                copy = run_figure_path(runs[0].run_id, png.stem)
                (folder / copy).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(png, folder / copy)
                links.append(f"[{md(v)}: {md(png.stem)} (seed {runs[0].seed})]({copy.as_posix()})")
        return links

    def grid_cells(self) -> list[str]:
        """The distinct overrides of the runs as JSON, in numeric order of their values."""
        def order(cell: str) -> list:
            return [(k, isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v))
                    for k, v in sorted(json.loads(cell).items())]

        return sorted({json.dumps(r.overrides, sort_keys=True) for r in self.runs if r.overrides}, key=order)

    def margin_rates(self) -> list[float]:
        """The swept values of the task's stability axis (its declared grid key, e.g. the learning rate), if this
        board has a stability-margin section: at least 3 numeric values and runs that report the stability metric
        (else [])."""
        axis, stable = self.conventions.stability_axis, self.conventions.stability_metric
        if not axis or not stable:
            return []
        rates = sorted({float(r.overrides[axis]) for r in self.runs if isinstance(r.overrides.get(axis), (int, float))
                        and not isinstance(r.overrides[axis], bool)})
        reports = any(stable in r.metrics for r in self.runs)
        return rates if len(rates) >= 3 and reports else []

    def at_rate(self, variant: str, rate: float) -> list[RunResult]:
        axis = self.conventions.stability_axis
        return [r for r in self.by_variant[variant] if isinstance(r.overrides.get(axis), (int, float))
                and float(r.overrides[axis]) == rate]

    def stable(self, run: RunResult) -> bool:
        """Whether a run trained stably: finished, with the task's stability metric at 1."""
        return run.status == "ok" and run.metrics.get(self.conventions.stability_metric) == 1.0

    def margin(self, variant: str) -> dict:
        """Largest stable rate (None if even the smallest was not), stable/total runs, and the best mean primary
        over rates at which every seed finished, with its rate."""
        largest, stable_runs, total, best, best_rate = None, 0, 0, math.nan, math.nan
        contiguous = True
        for rate in self.margin_rates():
            runs = self.at_rate(variant, rate)
            stable = [self.stable(r) for r in runs]
            stable_runs, total = stable_runs + sum(stable), total + len(runs)
            contiguous = contiguous and bool(runs) and all(stable)
            if contiguous:
                largest = rate
            values = [r.metrics[self.primary] for r in runs if r.status == "ok" and self.primary in r.metrics]
            mean = mean_std(values)[0] if values and len(values) == len(runs) else math.nan  # every seed finished
            if math.isfinite(mean) and (not math.isfinite(best) or (mean > best if self.higher else mean < best)):
                best, best_rate = mean, rate
        return {"largest": largest, "stable": stable_runs, "total": total, "best": best, "best_rate": best_rate}


def group(results: list[RunResult], by_config: bool = False) -> list[TaskBoard]:
    """One board per (task, preset); with ``by_config`` (ad-hoc runs, which follow no suite's grid) one per
    (task, preset, overrides), so that runs of different configs are never averaged together."""
    groups: dict[tuple[str, str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        config = ",".join(f"{k}={v}" for k, v in sorted(r.overrides.items())) if by_config else ""
        groups[(r.task, r.preset, config)].append(r)
    return [TaskBoard(t, p, runs, c) for (t, p, c), runs in sorted(groups.items())]


def at_chosen_cells(b: TaskBoard, keys: tuple[str, ...], confirm: tuple[int, ...] = ()) -> TaskBoard:
    """A tuned suite's board reduced to each variant's runs at its chosen cell (chosen on validation, as in
    ``tuned_table``; with ``confirm``, the stage-2 runs there): what its figures show, instead of every grid cell
    pooled. The board itself when nothing can be chosen."""
    val = next((r.validation_metric for r in b.runs if r.validation_metric), "")
    if not keys or not val:
        return b
    runs = []
    for v in b.variants:
        choice = tuning.best(tuning.choices([r for r in b.by_variant[v] if r.seed not in confirm], keys, val),
                             b.higher)
        picked = tuning.confirmed(choice, b.by_variant[v], confirm) if confirm else choice
        runs += picked.runs if picked is not None else []
    return TaskBoard(b.task, b.preset, runs, b.config) if runs else b


def numeric_rows(boards: list[TaskBoard]) -> list[dict]:
    """The leaderboard's per-variant numbers as numbers (``tables/results.csv|json``): n, mean, std and t 95%
    interval of the primary metric; for a 0/1 metric the success rate with its Wilson interval; the paired difference
    to softmax with its interval (n >= 5), p and Holm p; diverged and failed counts. Formatted text lives in the
    Markdown and HTML only."""
    out = []
    for b in boards:
        for r in b.rows():
            delta = r.get("delta") or {}
            rate = r.get("rate")
            out.append({"task": b.task, "preset": b.preset, "config": b.config, "variant": r["variant"],
                        "metric": b.primary, "higher_is_better": b.higher, "n": r["n"], "mean": r["mean"],
                        "std": r["std"], "ci_low": r["ci"][0], "ci_high": r["ci"][1],
                        "successes": rate[0] if rate else None, "runs": rate[1] if rate else None,
                        "rate": rate[0] / rate[1] if rate and rate[1] else None,
                        "rate_ci_low": rate[2][0] if rate else None, "rate_ci_high": rate[2][1] if rate else None,
                        "delta": delta.get("mean"), "delta_ci_low": delta.get("ci_low"),
                        "delta_ci_high": delta.get("ci_high"), "n_pairs": delta.get("n_pairs"),
                        "p": delta.get("p"), "p_holm": delta.get("p_holm"), "diverged": r["diverged"],
                        "failed": r["failed"]})
    return out


def write_numeric(rows: list[dict], folder: Path) -> list[str]:
    """``rows`` as results.csv and results.json (NaN as empty / null) in ``folder``; returns the file names."""
    import csv

    def number(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    rows = [{k: number(v) for k, v in row.items()} for row in rows]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["task"])
        writer.writeheader()
        writer.writerows(rows)
    (folder / "results.json").write_text(json.dumps(rows, indent=1))
    return ["results.csv", "results.json"]


def win_rates(boards: list[TaskBoard], robustness: bool = False) -> dict[str, float]:
    """Mean win rate over the tasks' primary metrics (or, with ``robustness``, their robustness metrics)."""
    outcomes, directions = {}, {}
    for b in boards:
        metric = b.robustness_metric() if robustness else b.primary
        if metric is None:
            continue
        scenario = f"{b.title}:{metric}"
        outcomes[scenario] = {v: b.outcomes(v, metric) for v in b.variants}
        directions[scenario] = b.directions[metric]
    return mean_win_rate(outcomes, directions)


def too_few(boards: list[TaskBoard]) -> list[str]:
    """Cells (task, variant) with fewer than 2 runs with an outcome (finished or diverged): no std, interval or
    ranking can come from them."""
    return [f"{md(b.title)} / {md(v)} (n={b.n_outcomes(v)})" for b in boards for v in b.variants if b.n_outcomes(v) < 2]


def win_rate_possible(boards: list[TaskBoard]) -> tuple[bool, int, int]:
    """Whether any paired comparison of the win rate could be significant: (possible, pairs needed, most pairs)."""
    needed, most = 0, 0
    for b in boards:
        tests = len(b.variants) * (len(b.variants) - 1) // 2
        needed = max(needed, min_pairs_for_significance(tests))
        most = max(most, max(len(b.outcomes(v, b.primary)) for v in b.variants))
    return most >= needed, needed, most


# ---- figures ----------------------------------------------------------------------------------------------------

def figure_points(board: TaskBoard) -> list[tuple[str, float, float, float]]:
    """(variant, point, low, high) per variant for the bars figure: the mean with its t 95% interval (none for
    n < 2), or for a 0/1 metric the success rate with its Wilson interval (a t interval would leave [0, 1])."""
    points = []
    for r in (board.row(v) for v in board.variants):
        if board.binary:
            k, n, (lo, hi) = r["rate"]
            points.append((r["variant"], k / n if n else math.nan, lo, hi))
        else:
            lo, hi = r["ci"] if r["n"] >= 2 else (r["mean"], r["mean"])
            points.append((r["variant"], r["mean"], lo, hi))
    return points


def bar_figure(board: TaskBoard, path: Path) -> None:
    """Each variant's mean (a dot) with its t 95% interval where n ≥ 2; the axis spans the values, not from 0, so
    that differences of a fraction of a point stay visible."""
    rows = figure_points(board)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(rows), 3.2))
    for i, (variant, mean, lo, hi) in enumerate(rows):
        ax.errorbar([i], [mean], yerr=[[max(0.0, mean - lo)], [max(0.0, hi - mean)]], fmt="o",
                    capsize=4, ms=7, color=variant_color(variant))
    ax.set_xticks(range(len(rows)), [plot_text(r[0]) for r in rows])
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.margins(y=0.15)
    ax.grid(axis="y", lw=0.5, alpha=0.5)
    ax.set_ylabel(f"{plot_text(board.primary)} ({'↑' if board.higher else '↓'})")
    ax.set_title(f"{plot_text(board.title)}\n" + ("success rate, Wilson 95% CI" if board.binary
                                                 else "mean, t 95% CI (n ≥ 2)"), fontsize=9)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def read_events(run_folder: Path, keys=Task.curve_keys) -> list[dict]:
    """The curve rows of a run's ``events.jsonl``: objects with an integer ``step``, keeping only the values of the
    curves ``keys`` (default: the SDK's default curves) that are finite numbers. A file that cannot be read, or rows that are not such objects, get one warning line
    naming the file and are skipped (a truncated last line, from an interrupted run, silently)."""
    path = run_folder / "events.jsonl"
    if not path.exists():
        return []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        print(f"warning: skipping {path}: not readable as UTF-8 JSON lines ({clean(err)})", file=sys.stderr)
        return []
    rows, bad = [], 0
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            bad += i < len(lines) - 1  # the last line may be cut short by an interrupted run
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            bad += 1
            continue
        rows.append({"step": step, **{k: float(row[k]) for k in keys if isinstance(row.get(k), (int, float))
                                      and not isinstance(row[k], bool) and math.isfinite(row[k])}})
    if bad:
        print(f"warning: {path}: skipped {bad} of {len(lines)} lines that are not JSON objects with an integer "
              "'step'", file=sys.stderr)
    return rows


def curve_means(board: TaskBoard, run_folders: dict[str, Path]) -> dict[str, dict[str, dict[int, float]]]:
    """The training curves the figure plots: curve key -> variant -> step -> mean over the variant's runs that
    logged that step (keys in the order of the task's declared curves, variants in the board's)."""
    keys = board.conventions.curves
    series: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for variant in board.variants:
        for r in board.by_variant[variant]:
            for row in read_events(run_folders[r.run_id], keys):
                for key in keys:
                    if key in row:
                        series[key][variant][row["step"]].append(row[key])
    return {key: {variant: {step: sum(values) / len(values) for step, values in by_step.items()}
                  for variant, by_step in series[key].items()} for key in keys if key in series}


def curves_figure(board: TaskBoard, run_folders: dict[str, Path], path: Path,
                  means: dict[str, dict[str, dict[int, float]]] | None = None) -> bool:
    """Training curves averaged over each variant's runs (``means``: ``curve_means`` given, e.g. from a published
    suite, instead of read from the run folders); False if no run logged any."""
    series = curve_means(board, run_folders) if means is None else means
    keys = [k for k in board.conventions.curves if k in series]
    if not keys:
        return False
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    for ax, key in zip(axes.flat, keys):
        for variant, by_step in series[key].items():
            steps = sorted(by_step)
            ax.plot(steps, [by_step[s] for s in steps], label=plot_text(variant),
                    lw=2.0 if variant in ("quest", BASELINE) else 1.0, color=variant_color(variant))
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        if key in board.conventions.log_curves:
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{plot_text(board.title)}: training curves, mean over runs", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def margin_figure(board: TaskBoard, path: Path) -> None:
    """The primary metric (mean over seeds of finished runs) against the learning rate, one line per variant;
    hollow markers where some seed was unstable, an x at the top for rates where no seed finished."""
    rates = board.margin_rates()
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    top = max((r.metrics[board.primary] for r in board.runs if r.status == "ok" and board.primary in r.metrics),
              default=1.0)
    for variant in board.variants:
        xs, ys, unstable, lost = [], [], [], []
        for rate in rates:
            runs = board.at_rate(variant, rate)
            values = [r.metrics[board.primary] for r in runs if r.status == "ok" and board.primary in r.metrics]
            if not values:
                lost.append(rate)
                continue
            xs.append(rate)
            ys.append(mean_std(values)[0])
            unstable.append(not all(board.stable(r) for r in runs))
        line, = ax.plot(xs, ys, "-", lw=2.0 if variant in ("quest", BASELINE) else 1.0, label=plot_text(variant),
                        color=variant_color(variant))
        for x, y, bad in zip(xs, ys, unstable):
            ax.plot(x, y, "o", color=line.get_color(), mfc="white" if bad else line.get_color(), ms=5)
        ax.plot(lost, [top * 1.15] * len(lost), "x", color=line.get_color(), ms=7)
    ax.set_xscale("log")
    if not board.higher:
        ax.set_yscale("log")
    ax.set_xlabel(plot_text(board.conventions.stability_axis))
    ax.set_ylabel(f"{plot_text(board.primary)} ({'↑' if board.higher else '↓'})")
    ax.set_title(f"{plot_text(board.title)}: stability margin (hollow: a seed unstable; x: none finished)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


# ---- documents ------------------------------------------------------------------------------------------------

def delta_text(delta: dict | None, binary: bool) -> str:
    """The Δ vs softmax cell: per-pair differences and the exact p-value for n < 5, a t interval for n ≥ 5; McNemar
    for binary outcomes; '*' when a binary outcome is significant after Holm's correction (p < 0.05). Continuous
    metrics get no mark here: the decision rule marks them, in the Summary and Verdicts sections."""
    if not delta or not delta["n_pairs"]:
        return "—"
    n, mark = delta["n_pairs"], " *" if binary and delta.get("p_holm", math.nan) < 0.05 else ""
    corrected = delta.get("p_holm", math.nan)
    sampled = delta.get("p_floor")  # a Monte-Carlo p: "p ≤ floor" at its floor
    tests = (format_p(delta["p"], sampled) if sampled else f"p={delta['p']:.3g}") + (
        f", Holm {corrected:.3g}" if math.isfinite(corrected) else "")
    if binary:
        m = delta["mcnemar"]
        return f"{delta['mean']:+.2f} (n={n}; +{m['ours_only']}/−{m['base_only']} discordant; McNemar {tests}){mark}"
    if n < 5:
        per_pair = ", ".join(f"{d:+.3f}" for d in delta["diffs"])
        return f"{delta['mean']:+.3f} (n={n}: {per_pair}; sign-flip {tests}){mark}"
    return f"{delta['mean']:+.3f} [{delta['ci_low']:+.3f}, {delta['ci_high']:+.3f}] (n={n}; sign-flip {tests}){mark}"


def delta_data(delta: dict | None) -> dict:
    """The numbers of a Δ vs softmax cell for the data files: mean, interval bounds (n ≥ 5), p, Holm p, n."""
    if not delta or not delta["n_pairs"]:
        return {}
    return {"mean": delta["mean"], "low": delta.get("ci_low") if delta["n_pairs"] >= 5 else None,
            "high": delta.get("ci_high") if delta["n_pairs"] >= 5 else None, "p": delta.get("p"),
            "p_holm": delta.get("p_holm"), "n": delta["n_pairs"]}


def delta_cell(delta: dict | None, binary: bool) -> Text:
    """``delta_text`` as a cell that carries its numbers (``delta_data``)."""
    return Text(delta_text(delta, binary), data=delta_data(delta))


def confirmed_delta_cell(delta: dict | None) -> Text:
    """A confirmed comparison's Δ in a task's tuned table: the mean and n alone, since the Verdicts section's
    interval and p (Holm over the page) decide it; a second, per-task interval and p beside them could disagree."""
    if not delta or not delta["n_pairs"]:
        return Text("—")
    return Text(f"{delta['mean']:+.3f} (n={delta['n_pairs']}; decided in Verdicts)",
                data={"mean": delta["mean"], "n": delta["n_pairs"]})


def success_cell(b: TaskBoard, variant: str, metric: str) -> Text:
    """k/n successes of a binary metric; for a variant other than softmax also the exact McNemar p-value against
    softmax on the same pairs (uncorrected)."""
    ours = b.successes(variant, metric)
    text, data = f"{sum(ours.values())}/{len(ours)}", {"successes": sum(ours.values()), "n": len(ours)}
    if variant == BASELINE or BASELINE not in b.by_variant:
        return Text(text, data=data)
    m = mcnemar_exact(ours, b.successes(BASELINE, metric))
    return Text(f"{text} (+{m['ours_only']}/−{m['base_only']}, p={m['p']:.2g})" if m["n_pairs"] else text,
                data={**data, "mcnemar_p": m["p"] if m["n_pairs"] else None})


def cell_success_table(b: TaskBoard) -> list:
    """Per grid cell and variant: successes at every binary metric and the mean of the continuous metric closest in
    name to the primary, each with its paired test against softmax on the cell's seeds."""
    binary = [m for m in b.directions if b.is_binary(m)]
    continuous = [m for m in b.directions if not b.is_binary(m)]  # the one closest in name to the primary
    score = max(continuous, key=lambda m: len(os.path.commonprefix([m, b.primary])), default=None)
    seeds = max(len(b.in_cell(cell).by_variant[v]) for cell in b.grid_cells() for v in b.in_cell(cell).variants)
    note = (f"By grid cell, paired with `{BASELINE}` on the cell's seeds: successes k/n with (+ours only/−"
            f"{BASELINE} only, exact McNemar p){', and the mean `' + md_code(score) + '` with its mean paired difference and exact sign-flip p' if score else ''}. "
            f"p-values are per cell and uncorrected; with {seeds} pairs per cell the smallest exact p is "
            f"{2 / 2 ** seeds:.3g}" + (", so no single cell can reach p < 0.05: read the cells as a map and the pooled "
                                     "table above for tests." if 2 / 2 ** seeds >= 0.05 else "."))
    table = Table([Text("cell"), Text("variant"), *binary, *([Text("{} (Δ, p)", score)] if score else [])],
                  caption="by cell")
    for cell in b.grid_cells():
        sub = b.in_cell(cell)
        label = cell_text(json.loads(cell))
        for v in sub.variants:
            row = [label, v, *[success_cell(sub, v, m) for m in binary]]
            if score:
                mean = mean_std(list(sub.values(v, score).values()))[0]
                text = fmt(mean, 2)
                if v != BASELINE and BASELINE in sub.by_variant:
                    d = paired_difference(sub.values(v, score), sub.values(BASELINE, score))
                    text += f" ({d['mean']:+.2f}, p={d['p']:.2g})" if d["n_pairs"] else ""
                row.append(meta.number_or_text(mean, text))
            table.rows.append(row)
    return [note, "", table, ""]


def mean_cell(mean: float, std: float, n: int, digits: int = 3) -> str:
    return fmt(mean, digits) if n < 2 else f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def mean_value(mean: float, std: float, n: int, digits: int = 3) -> Num | Text:
    """A mean ± std cell: for n < 2 the one number it is (its data files get the number)."""
    return Num(mean, fmt(mean, digits)) if n < 2 else Text(mean_cell(mean, std, n, digits),
                                                           data={"mean": mean, "std": std, "n": n})


def summary_table(boards: list[TaskBoard], tuned_deltas: dict[str, dict[str, dict]] | None = None) -> list:
    """Tasks × variants: each variant's mean paired difference to softmax on the task's primary metric, with its
    Holm-corrected p-value and the number of pairs; * where significant after correction. ``tuned_deltas`` (a tuned
    suite's, by board title): the differences with each variant at its best cell instead of pooled over cells."""
    others = [v for v in variant_order({v for b in boards for v in b.variants}) if v != BASELINE]
    if not others or not any(BASELINE in b.variants for b in boards):
        return []
    table = Table([Text("task"), Text("primary"), *others])
    rule = meta.decide_page(boards, tuned_deltas or {})  # the decision rule (docs/statistics.md)
    for b in boards:
        deltas = (tuned_deltas or {}).get(b.title) or {r["variant"]: r.get("delta") for r in b.rows()}
        cells = []
        for v in others:
            d = deltas.get(v)
            if not d or not d["n_pairs"]:
                cells.append(Text("—"))
                continue
            decided = rule.get((b.title, v), {})
            if decided.get("verdict", "no verdict") != "no verdict":
                cells.append(Text(f"{d['mean']:+.3f} (t p {decided['p_holm']:.2g}, n={d['n_pairs']})"
                                  + (" *" if decided["mark"] else ""),
                                  data={"mean": d["mean"], "p_holm": decided["p_holm"], "n": d["n_pairs"]}))
                continue
            mark = " *" if b.binary and d.get("p_holm", math.nan) < 0.05 else ""
            cells.append(Text(f"{d['mean']:+.3f} (p {d['p_holm']:.2g}, n={d['n_pairs']}){mark}",
                              data={"mean": d["mean"], "p_holm": d.get("p_holm"), "n": d["n_pairs"]}))
        table.rows.append([b.title, Text("{} " + ("↑" if b.higher else "↓"), b.primary), *cells])
    return ["## Summary: Δ vs softmax", "",
            f"Mean paired difference of each task's primary metric to `{BASELINE}` (Δ > 0 is better where higher is "
            "better), its Holm-corrected p-value and the number of pairs n; — = no pairs. With n ≥ 10 the decision "
            "rule's t p, Holm-corrected over the page, and * = significant by it (the Verdicts section); with fewer "
            "pairs the sign-flip p, Holm-corrected per task, and no mark (binary metrics: McNemar, * after Holm). "
            "The task sections below give the test used and the per-pair values."
            + (" Tuned suite: each variant at its own best cell (chosen on validation), paired on the seed."
               if tuned_deltas else ""), "", table, ""]


def provenance(boards: list[TaskBoard]) -> list:
    """Where the numbers come from, as a table: run count and dates, code versions, packages, machines, total
    compute, and where a board's conventions come from when its runs' records do not hold them."""
    runs = [r for b in boards for r in b.runs]

    def listed(items: list[tuple[str, ...]], template: str, sep: str = ", ") -> Text:
        """Untrusted values in a trusted template, once per item."""
        return Text(sep.join([template] * len(items)), *(x for item in items for x in item))

    shas = sorted({(str(r.env.get("git_sha") or "unknown")[:12], " (dirty)" if r.env.get("git_dirty") else "")
                   for r in runs})
    dates = sorted(r.finished_at for r in runs if r.finished_at) or ["?"]
    packages = defaultdict(set)
    for r in runs:
        for name, ver in (r.env.get("packages") or {}).items():
            packages[clean(name)].add(clean(ver))
    hosts = sorted({(clean(r.env.get("host", "?")), clean(r.env.get("device", "?")),
                     clean(r.env.get("torch_threads", "?"))) for r in runs})
    hours = sum(r.cost.get("wall_s", 0.0) for r in runs) / 3600
    table = Table([Text("what"), Text("value")], [
        [Text("runs"), len(runs)],
        [Text("finished"), Text("{} to {}", dates[0], dates[-1])],
        [Text("code (git)"), Text(", ".join(["{}" + dirty for _, dirty in shas]), *(sha for sha, _ in shas))],
        [Text("packages"), listed([(k, "/".join(sorted(v))) for k, v in sorted(packages.items())], "{} {}")],
        [Text("machines"), listed(hosts, "{} ({}, {} threads)")],
        [Text("compute (run-hours: the sum of the runs' wall times)"), Num(hours, f"{hours:.2f}")]])
    if len(boards) > 1:  # what each task cost, e.g. to plan confirming it again or at a larger preset
        table.rows.append([Text("compute by task (run-hours, runs)"), listed(
            [(b.title, f"{sum(r.cost.get('wall_s', 0.0) for r in b.runs) / 3600:.2f}", str(len(b.runs)))
             for b in boards], "{} {} ({} runs)", "; ")])
    undeclared = [b for b in boards if b.conventions.undeclared]
    if undeclared:
        table.rows.append([Text("conventions (curves, stability axis and metric, robustness metric)"), listed(
            [(b.title, str(b.conventions.undeclared), str(len(b.runs)), b.conventions.source) for b in undeclared],
            "{}: {} of {} runs' records hold none (written before results stored them), read with {}", "; ")])
    return ["## Provenance", "", table, ""]


def conventions_note(b: TaskBoard) -> list[str]:
    """A visible note when a board's runs disagree on a convention (``conventions.of_runs``), else nothing."""
    conflicts = b.conventions.conflicts
    if not conflicts:
        return []
    what = "; ".join(f"`{md_code(k)}`: " + " vs ".join(md(json.dumps(v)) for v in values)
                     for k, values in conflicts.items())
    return [f"> **Runs disagree on the task's conventions** (records of different task versions?): {what}. The "
            "curves figure shows every run's curves (a log axis only where all ask for one); a disputed stability "
            "axis, stability metric or robustness metric is not used.", ""]


def markdown(suite: str, boards: list[TaskBoard], wins: dict[str, float], figures: dict[str, list[str]],
             ignored: int = 0, links: dict[str, list[str]] | None = None,
             robust_wins: dict[str, float] | None = None, tune: tuple[str, ...] = (),
             folder: Path | None = None, confirm: tuple[int, ...] = ()) -> Page:
    """The leaderboard page as blocks: prose lines and tables (``quest_bench.report_tables.Page``)."""
    page = Page([f"# Leaderboard: {md(suite)}", ""])
    tuned, scores, at_best = {}, {}, {}
    for b in boards:
        if tune:
            tuned[b.title], scores[b.title], at_best[b.title] = tuned_table(b, tune, confirm)
        if not scores.get(b.title):  # not tuned (or nothing to tune on): the mean over every run
            scores[b.title] = {v: b.row(v)["mean"] for v in b.variants}
    few = too_few(boards)
    if few:
        page += [f"> **Too few runs for statistics.** {len(few)} cells have fewer than 2 finished runs: "
                 + "; ".join(few[:12]) + (" …" if len(few) > 12 else "") + ". They show no std, interval or error "
                 "bar, and no cross-task ranking is computed; run more seeds for a verdict.", ""]
    total = sum(len(b.runs) for b in boards)
    if ignored:
        page += [f"{ignored} runs in the results folder are not part of the suite as defined now (another code "
                 "version or suite definition) and are left out.", ""]
    page += [f"{total} runs. n = finished runs per variant (seeds × grid cells); means ± sample std (no std for "
             f"n < 2). Δ vs `{BASELINE}`: mean paired difference on the same seed and overrides; for n < 5 the "
             "per-pair differences and an exact sign-flip p-value, for n ≥ 5 also a t 95% interval; binary outcomes "
             "use an exact McNemar test (* = significant at 0.05 after Holm's correction over the task's variants); "
             "p-values Holm-corrected over each task's variants (with n pairs the smallest sign-flip p is 2/2^n, "
             "0.25 at n = 3). Continuous metrics are decided by one rule, in the Summary and Verdicts sections: "
             "with n ≥ 10 pairs the paired t test, Holm-corrected over the page (docs/statistics.md). Diverged "
             "and failed runs are counted beside the means and as failures in success rates.", ""]
    page += summary_table(boards, at_best)
    possible, needed, most = win_rate_possible(boards)
    if wins and not few and not possible:
        page += ["## Mean win rate across tasks", "",
                 f"Not computed: with {max(len(b.variants) for b in boards)} variants a win (an exact sign test, "
                 f"Holm-corrected over every pair of variants) needs at least {needed} paired runs per comparison, "
                 f"and these boards have at most {most}; every variant would tie at 0.5.", ""]
    if wins and not few and possible:
        table = Table([Text("variant"), Text("win rate (primary)"), *([Text("win rate (robustness)")]
                                                                      if robust_wins else [])])
        for v, w in sorted(wins.items(), key=lambda kv: -kv[1]):
            robust = robust_wins.get(v, math.nan) if robust_wins else None
            table.rows.append([v, Num(w, fmt(w)), *([Num(robust, fmt(robust))] if robust_wins else [])])
        page += ["## Mean win rate across tasks", "",
                 "A win is a significantly better result on paired runs (exact sign test per pair of variants, "
                 "Holm-corrected per metric, diverged or failed runs ranking worst); anything else is a tie (½). "
                 "Metrics: each task's primary metric" + (", and separately its declared robustness metric."
                                                          if robust_wins else ".")
                 + (" In a tuned suite the pairs are every (seed, grid cell): the win rate is over the whole search"
                    " (how each variant fares across learning rates), not at each variant's best cell, which the"
                    " summary above compares." if tune else ""), "", table, ""]
    if folder is not None and not few:
        page += profile_section(scores, {b.title: b.higher for b in boards}, folder)
    page += meta.page_sections(boards, at_best, folder, "stage 2 of tune-then-confirm" if confirm else
                               "each variant at its best cell" if tune else "pooled over runs", variant_color)
    for b in boards:
        page += task_section(b, tuned.get(b.title, []), figures.get(b.title, []), (links or {}).get(b.title))
    page += provenance(boards)
    return page


def task_section(b: TaskBoard, tuned: list, figures: list[str], links: list[str] | None) -> list:
    """One board's section: its table, the tuning table, the grid cells, the stability margin, figures."""
    arrow = "higher" if b.higher else "lower"
    extras = [m for m in b.directions if m != b.primary]
    blocks = [f"## {md(b.title)}", "", f"Primary metric: `{md_code(b.primary)}` ({arrow} is better).", "",
              *conventions_note(b)]
    rate = [Text("success rate [Wilson 95%]")] if b.binary else []
    table = Table([Text("variant"), Text("n"), Text("{} mean ± std", b.primary), *rate, Text(f"Δ vs {BASELINE}"),
                   *extras, Text("diverged"), Text("failed")], caption="runs")
    for r in b.rows():
        v = r["variant"]
        rate_cell = []
        if b.binary:
            k, n, (lo, hi) = r["rate"]
            rate_cell = [Text(f"{k}/{n} [{fmt(lo, 2)}, {fmt(hi, 2)}]",
                              data={"successes": k, "n": n, "wilson_low": lo, "wilson_high": hi})]
        table.rows.append([v, r["n"], mean_value(r["mean"], r["std"], r["n"]), *rate_cell,
                           delta_cell(r.get("delta"), b.binary),
                           *[success_cell(b, v, m) if b.is_binary(m)
                             else mean_value(*r["extra"][m], len(b.values(v, m))) for m in extras],
                           r["diverged"], r["failed"]])
    blocks += [table, "", *tuned]
    cells = b.grid_cells()
    if len(cells) > 1 and b.binary:
        blocks += cell_success_table(b)
    elif len(cells) > 1:
        grid = Table([Text("overrides"), *b.variants], caption="by cell")
        for cell in cells:
            row = [cell_text(json.loads(cell))]
            for v in b.variants:
                vals = [r.metrics[b.primary] for r in b.ok(v) if json.dumps(r.overrides, sort_keys=True) == cell]
                row.append(Text(f"{fmt(mean_std(vals)[0], 2)} (n={len(vals)})" if vals else "—"))
            grid.rows.append(row)
        blocks += [f"`{md_code(b.primary)}` by grid cell (mean over the n seeds of each cell):", "", grid, ""]
    if b.margin_rates():
        blocks += margin_table(b)
    blocks += mce_table(b)
    blocks += [f"![{name}]({name})" for name in figures] + [""]
    if links:
        blocks += ["Per-run figures: " + " · ".join(links), ""]
    return blocks


def mce_table(b: TaskBoard) -> list:
    """Mean corruption error per variant relative to softmax (``TaskBoard.mce``), with its paired Δ; nothing for a
    task without corruption metrics or without softmax runs."""
    if not b.corruptions() or BASELINE not in b.variants:
        return []
    table = Table([Text("variant"), Text("mCE vs softmax (%) ↓"), Text("Δ mCE (paired)")], caption="mCE")
    table.rows += [[v, *b.mce_cells(v)] for v in b.variants]
    return [f"mCE: per run and corruption ({', '.join(map(md, b.corruptions()))}), the error summed over its "
            f"severities relative to `{BASELINE}`'s mean over runs, averaged over corruptions; 100 = as robust as "
            f"`{BASELINE}` on average, and `{BASELINE}`'s own spread shows its seed noise. Δ mCE is paired on the "
            "seed (and grid cell), uncorrected.", "", table, ""]


def cell_text(cell: dict) -> Text:
    """A grid cell's overrides as text (keys and values untrusted)."""
    return Text(", ".join(["{}={}"] * len(cell)), *(x for kv in cell.items() for x in kv))


def searched_values(b: TaskBoard, key: str) -> str:
    values = sorted({r.overrides[key] for r in b.runs if key in r.overrides}, key=lambda x: (isinstance(x, str), x))
    return ", ".join(f"{x:g}" if isinstance(x, float) else md(x) for x in values)


def tuned_table(b: TaskBoard, keys: tuple[str, ...], confirm: tuple[int, ...] = ()) -> tuple[list[str], dict[str, float], dict[str, dict]]:
    """The equal-tuning-budget section of a board (quest_bench.tuning), each variant's test mean at its best cell
    (for the performance profile) and its paired difference to softmax there (for the summary). ``confirm``: a
    confirming suite's stage-2 seeds: the cell is chosen on the other seeds and reported on these."""
    val = next((r.validation_metric for r in b.runs if r.validation_metric), "")
    space = ", ".join(f"{md(k)} ∈ {{{searched_values(b, k)}}}" for k in keys)
    if not val:
        return [f"Equal tuning budget over {space}: not computed, the task reports no validation metric.", ""], {}, {}
    options = {v: tuning.choices([r for r in b.by_variant[v] if r.seed not in confirm], keys, val) for v in b.variants}
    chosen = {v: tuning.best(options[v], b.higher) for v in b.variants}
    reported = {v: tuning.confirmed(c, b.by_variant[v], confirm) for v, c in chosen.items()} if confirm else chosen
    default = tuning.preset_cell(b.runs, keys)  # the preset's own values, as the runs stored them
    at_default = {v: tuning.at(options[v], default) for v in b.variants}

    def deltas(pick: dict) -> dict[str, dict]:
        base = pick.get(BASELINE)
        out = {v: paired_difference(c.by_seed(b.primary), base.by_seed(b.primary))
               for v, c in pick.items() if v != BASELINE and c is not None and base is not None}
        adjusted = holm({v: d["p"] for v, d in out.items() if d["n_pairs"]})
        for v, d in out.items():
            d["p_holm"] = adjusted.get(v, math.nan)
        return out

    d_default, d_best = deltas(at_default), deltas(reported)
    default_label = md(tuning.Choice(default).label()) if default else "not in the search space"
    scores = {}
    table = Table([Text("variant"), Text("at the default: {} (n)", b.primary), Text(f"Δ vs {BASELINE}"),
                   Text("best cell (by {})", val), Text("{} there", val), Text("{} at the best cell (n)", b.primary),
                   Text(f"Δ vs {BASELINE}, each at its best"), Text("diverged / failed in the search")],
                  caption="tuned")
    lines = [f"**Equal tuning budget** over {space} × the seeds (AlgoPerf-style external tuning): per variant the "
             f"cell with the best mean `{md_code(val)}` over its seeds (every seed finished) is chosen on validation, "
             f"and its test `{md_code(b.primary)}` is reported; the default recipe ({default_label}) beside it. Δ vs `{BASELINE}` is "
             "paired on the seed (each variant at its own cell), Holm-corrected over the variants per column."
             + (f" Tune, then confirm: the cell is chosen on the search's seeds and the best-cell columns report stage 2 "
                f"only (seeds {', '.join(map(str, confirm))}, fresh); the Verdicts section decides, so its Δ shows no interval or "
                f"p of its own." if confirm else ""),
             "", table]
    for v in b.variants:
        def mean_of(c):
            vals = list(c.by_seed(b.primary).values()) if c else []
            mean, std = mean_std(vals) if vals else (None, None)
            return Text(mean_cell(mean, std, len(vals)) + f" ({len(vals)})" if vals else "—",
                        data={"mean": mean, "std": std if len(vals) > 1 else None, "n": len(vals)} if vals else None)

        c = chosen[v]
        scores[v] = mean_std(list(reported[v].by_seed(b.primary).values()))[0] if c else math.nan
        runs = [r for r in b.by_variant[v] if r.seed not in confirm]  # the search's (stage 1's) runs
        table.rows.append([
            v, mean_of(at_default[v]), delta_cell(d_default.get(v), False), cell_label(options[v], c),
            Num(c.validation, fmt(c.validation)) if c else Text("—"), mean_of(reported[v]),
            confirmed_delta_cell(d_best.get(v)) if confirm else delta_cell(d_best.get(v), False),
            Text(f"{sum(r.status == 'diverged' for r in runs)} / {sum(r.status == 'failed' for r in runs)} of {len(runs)}")])
    if any(c and tuning.edge_keys(options[v], c) for v, c in chosen.items()):
        lines += ["", "edge: the best cell lies at the smallest or largest value searched for that key, so the "
                  "optimum may lie outside the search; widen the grid before reading the tuned Δ as final."]
    return lines + [""], scores, d_best


def cell_label(options: list[tuning.Choice], choice: tuning.Choice | None) -> Text:
    if choice is None:
        return Text("none (no cell with every seed finished)")
    edges = tuning.edge_keys(options, choice)
    return Text("{}" + (" (edge of " + ", ".join(["{}"] * len(edges)) + ")" if edges else ""), choice.label(), *edges)


def profile_section(scores: dict[str, dict[str, float]], directions: dict[str, bool], folder: Path) -> list:
    """The performance profile across tasks (quest_bench.profiles): a table of ρ(τ) and its figure."""
    task_ratios, skipped = profiles.ratios(scores, directions)
    if len(task_ratios) < 2:
        return []
    profiles.profile_figure(task_ratios, folder / "performance-profile.png", variant_color,
                            "performance profile: fraction of tasks within τ of the best variant")
    rho = profiles.profile(task_ratios)
    lines = ["## Performance profile across tasks", "",
             f"Per task, each variant's mean primary metric (at its best cell where the suite tunes) relative to the "
             f"best variant's (a ratio ≥ 1; lower-is-better metrics inverted); ρ(τ) = the fraction of the "
             f"{len(task_ratios)} tasks on which a variant is within a factor τ of the best. Means of finished runs; "
             "a variant without any on a task counts as never within τ. A profile ranks means and carries no test: "
             "read it with the Δ tables." + (f" Left out (scores not all positive): {', '.join(map(md, skipped))}." if skipped
                                             else ""), "",
             Table([Text("variant"), *(Text(f"τ={t:g}") for t in profiles.TAUS)],
                   [[v, *(Num(x, fmt(x, 2)) for x in r)] for v, r in sorted(rho.items(), key=lambda kv: -sum(kv[1]))])]
    return lines + ["", "![performance-profile.png](performance-profile.png)", ""]


def margin_table(b: TaskBoard) -> list:
    """The stability margin over the task's declared stability axis (``TaskBoard.margin``), with what the task's
    stability metric means."""
    conv = b.conventions
    rates = ", ".join(f"{r:g}" for r in b.margin_rates())
    note = f", {md(conv.stability_note)}" if conv.stability_note else ""
    table = Table([Text("variant"), Text("largest stable {}", conv.stability_axis), Text("stable runs"),
                   Text("best {}", b.primary), Text("at {}", conv.stability_axis)], caption="stability margin")
    for v in b.variants:
        m = b.margin(v)
        table.rows.append([v, Text("none") if m["largest"] is None else Num(m["largest"], f"{m['largest']:g}"),
                           Text(f"{m['stable']}/{m['total']}"), Num(m["best"], fmt(m["best"], 1)),
                           Num(m["best_rate"], "—" if not math.isfinite(m["best_rate"]) else f"{m['best_rate']:g}")])
    return [f"Stability margin over `{md_code(conv.stability_axis)}` = {rates}: the largest value at which every "
            f"seed, at that value and all smaller ones, trained stably (`{md_code(conv.stability_metric)}` = 1: no "
            f"divergence{note}); best `{md_code(b.primary)}` is the best mean over seeds at a value where every seed "
            "finished.", "", table, ""]


def write_leaderboard(runs: RunSet | Store, suite: str, run_ids: set[str] | None = None,
                      folder: Path | None = None, tune: tuple[str, ...] = (), confirm: tuple[int, ...] = (),
                      curves=None) -> Path:
    """Write README.md, index.html and the PNG figures to ``folder`` (default <results>/<suite>/leaderboard/ for a
    Store); return that folder. ``runs``: one suite's Store, or any RunSet (ad-hoc runs, several suites merged).

    ``run_ids``: the runs of the suite as defined now; others in the folder (older code versions) are left out.
    ``tune``: the suite's tuning keys (``Suite.tune``): each task gets its equal-tuning-budget table. ``confirm``: a
    confirming suite's stage-2 seeds (``Suite.confirm``): cells are chosen without them and reported with them.
    ``curves``: a function from the board a curves figure shows to its ``curve_means`` (a published suite's, or
    one that records them), called instead of ``curve_means`` on the run folders' events.jsonl files.
    Runs that cannot be used (failed, or ok without a finite primary metric) get one warning line each on stderr;
    failed ones are counted in the tables, and the next sweep runs them again.
    """
    if isinstance(runs, Store):
        folder = runs.root / "leaderboard" if folder is None else folder
        runs = suite_runs(runs.root.parent, runs.root.name)
    if folder is None:
        raise ValueError("write_leaderboard needs an output folder for runs that are not one suite's")
    results = runs.results
    ignored = 0
    if run_ids is not None:
        kept = [r for r in results if r.run_id in run_ids]
        ignored, results = len(results) - len(kept), kept
    if not results:
        raise ValueError(f"{suite!r} has no results yet")
    for r in results:
        problem = unusable_reason(r)
        if problem:
            print(f"warning: run {r.run_id} ({clean(r.task)}/{clean(r.variant)}/seed {r.seed}) not counted: "
                  f"{clean(problem)}; the next "
                  "sweep runs it again", file=sys.stderr)
    boards = group(results, by_config=suite == ADHOC)
    folder = claim_folder(Path(folder))
    figures: dict[str, list[str]] = {}
    for b in boards:
        stem = slug(f"{b.task}-{b.preset}" + (f"-{b.config}" if b.config else ""))
        shown = at_chosen_cells(b, tune, confirm) if tune else b  # a tuned suite: each variant at its chosen cell
        bar_figure(shown, folder / f"{stem}-bars.png")
        figures[b.title] = [f"{stem}-bars.png"]
        means = None if curves is None else curves(shown)
        if curves_figure(shown, runs.folders, folder / f"{stem}-curves.png", means):
            figures[b.title].append(f"{stem}-curves.png")
        if b.margin_rates():
            margin_figure(b, folder / f"{stem}-margin.png")
            figures[b.title].append(f"{stem}-margin.png")
    links = {b.title: b.figure_links(runs.folders, folder) for b in boards}
    page = markdown(suite, boards, win_rates(boards), figures, ignored, links, win_rates(boards, robustness=True),
                    tune, folder, confirm)
    shutil.rmtree(folder / "tables", ignore_errors=True)
    tables = write_numeric(numeric_rows(boards), folder / "tables") + write_data(page.tables, folder / "tables", slug)
    page += ["## Tables as data", "", "Every table above as CSV and JSON: "
             + " · ".join(f"[{name}](tables/{name})" for name in tables), ""]
    (folder / "README.md").write_text(page.markdown())
    made = {name for names in figures.values() for name in names} | {"performance-profile.png"}
    (folder / "index.html").write_text(html_page(suite, page, folder, made))
    return folder


MARKER = ".quest-bench-leaderboard"  # in a folder the leaderboard writes: it may write there again
OUTPUTS = re.compile(r"README\.md|index\.html|tables|run-figures|[A-Za-z0-9._-]+\.png|\.pagecheck-index\.html")


def claim_folder(folder: Path) -> Path:
    """Make ``folder`` the leaderboard's: new, empty, or one it wrote before (its marker file, or, from versions
    before the marker, nothing but its own outputs with a README.md it titled). Any other folder is refused before
    a file is written, so that --out never overwrites or deletes someone else's files."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is a file; give a folder")
    if folder.is_dir() and not (folder / MARKER).exists():
        entries = sorted(p.name for p in folder.iterdir())
        ours = all(OUTPUTS.fullmatch(name) for name in entries)
        try:
            titled = (folder / "README.md").read_text(errors="replace").startswith("# Leaderboard: ")
        except OSError:
            titled = False
        if entries and not (ours and titled):
            shown = ", ".join(entries[:5]) + (" …" if len(entries) > 5 else "")
            raise ValueError(f"--out {folder} is not empty and is not a leaderboard folder (it holds {shown}); the "
                             "leaderboard writes only into a new or empty folder or one it wrote before: choose "
                             "another --out")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("written by quest-bench leaderboard: it may replace README.md, index.html, "
                                 "tables/, run-figures/ and *.png here\n")
    return folder
