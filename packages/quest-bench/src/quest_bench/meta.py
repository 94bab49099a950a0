"""Across domains: a standardised paired effect per task, combined by a random-effects meta-analysis and drawn as a
forest plot; the decision rule applied to every comparison of a page; and stability (the largest value of a task's
stability axis, e.g. the learning rate, at which no seed diverges). docs/statistics.md states the formulas.

- ``standardised_effect``: per task, Hedges-corrected d_z of the paired differences (mean / sd), oriented so that
  > 0 is better, with its standard error and a normal 95% interval.
- ``dersimonian_laird``: the DerSimonian–Laird random-effects estimate over tasks: τ², Q, I², the pooled effect,
  its standard error, interval and p.
- ``forest_plot``: one panel per variant (tasks and the pooled diamond), written as a PNG.
- ``page_sections``: the leaderboard's "Verdicts" (``stats.decide`` over every comparison on the page), "Across
  domains" and "Stability" sections, as prose lines and tables (``quest_bench.report_tables``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats as st

from quest_bench.figures import save_figure

BASELINE = "softmax"
MIN_PAIRS_FOR_EFFECT = 3  # Hedges' correction J = 1 − 3/(4(n − 1) − 1) needs n ≥ 3
STABILITY_KEY = "lr"  # the SDK's default stability axis (quest_sdk.task.Task.stability_axis); boards use their own


def standardised_effect(diffs: list[float], higher_is_better: bool = True, level: float = 0.95) -> dict:
    """The standardised paired effect of ``diffs`` (ours − baseline): d_z = mean / sd (ddof=1), times Hedges'
    small-sample correction J = 1 − 3/(4·df − 1), df = n − 1, negated where lower is better (so > 0 is better);
    its standard error J·√(1/n + d_z²/(2n)) and a normal interval at ``level``. NaN for n < 3 or sd = 0."""
    d = np.asarray(diffs, dtype=float)
    n = int(d.size)
    nan = float("nan")
    if n < MIN_PAIRS_FOR_EFFECT or float(d.std(ddof=1)) == 0.0:
        return {"n": n, "d_z": nan, "g": nan, "se": nan, "ci_low": nan, "ci_high": nan}
    sign = 1.0 if higher_is_better else -1.0
    d_z = sign * float(d.mean()) / float(d.std(ddof=1))
    j = 1 - 3 / (4 * (n - 1) - 1)
    se = j * math.sqrt(1 / n + d_z ** 2 / (2 * n))
    z = st.norm.ppf(0.5 + level / 2)
    return {"n": n, "d_z": d_z, "g": j * d_z, "se": se, "ci_low": j * d_z - z * se, "ci_high": j * d_z + z * se}


def dersimonian_laird(effects: list[float], ses: list[float], level: float = 0.95) -> dict:
    """DerSimonian–Laird random-effects meta-analysis of ``effects`` with standard errors ``ses``: inverse-variance
    weights w = 1/se², Cochran's Q about the fixed-effect mean, τ² = max(0, (Q − (k − 1)) / (Σw − Σw²/Σw)),
    I² = max(0, (Q − (k − 1)) / Q), and the pooled estimate with weights 1/(se² + τ²), its standard error, normal
    interval at ``level`` and two-sided p. Studies without a finite effect or a positive se are left out; fewer
    than 2 left give NaN."""
    pairs = [(y, s) for y, s in zip(effects, ses) if math.isfinite(y) and math.isfinite(s) and s > 0]
    k = len(pairs)
    keys = ("pooled", "se", "ci_low", "ci_high", "p", "tau2", "q", "i2")
    if k < 2:
        return {"k": k, **{key: float("nan") for key in keys}, "weights": [1.0] * k}
    y = np.array([p[0] for p in pairs])
    v = np.array([p[1] for p in pairs]) ** 2
    w = 1 / v
    fixed = float(np.sum(w * y) / np.sum(w))
    q = float(np.sum(w * (y - fixed) ** 2))
    c = float(np.sum(w) - np.sum(w ** 2) / np.sum(w))
    tau2 = max(0.0, (q - (k - 1)) / c)
    w_star = 1 / (v + tau2)
    pooled = float(np.sum(w_star * y) / np.sum(w_star))
    se = float(math.sqrt(1 / np.sum(w_star)))
    z = st.norm.ppf(0.5 + level / 2)
    return {"k": k, "pooled": pooled, "se": se, "ci_low": pooled - z * se, "ci_high": pooled + z * se,
            "p": float(2 * st.norm.sf(abs(pooled / se))), "tau2": tau2, "q": q,
            "i2": max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0, "weights": list(w_star / np.sum(w_star))}


def forest_plot(panels: dict[str, tuple[list[dict], dict]], path: Path, title: str, colors=None) -> None:
    """A forest plot, one panel per variant: ``panels[variant] = (studies, pooled)``, each study a dict with
    label, g, ci_low, ci_high (a square sized by its weight in ``pooled``), ``pooled`` from ``dersimonian_laird``
    (a diamond). Labels are drawn as plain text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(studies) for studies, _ in panels.values()) + 2
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 0.38 * rows + 1.4), squeeze=False,
                             sharey=True)
    for ax, (variant, (studies, pooled)) in zip(axes[0], panels.items()):
        color = colors(variant) if colors else "#1f77b4"
        weights = pooled.get("weights") or [1.0] * len(studies)
        for i, (study, weight) in enumerate(zip(studies, weights)):
            ax.plot([study["ci_low"], study["ci_high"]], [i, i], color=color, lw=1.2)
            ax.plot(study["g"], i, "s", color=color, markersize=4 + 10 * math.sqrt(weight))
        y = len(studies) + 0.6
        if math.isfinite(pooled.get("pooled", math.nan)):
            lo, mid, hi = pooled["ci_low"], pooled["pooled"], pooled["ci_high"]
            ax.fill([lo, mid, hi, mid], [y, y - 0.3, y, y + 0.3], color=color, alpha=0.8)
        ax.axvline(0, color="0.4", lw=0.8, ls="--")
        ax.set_title(plain(f"{variant} vs {BASELINE}"), fontsize=10)
        ax.set_xlabel("standardised effect g (> 0: better)")
        ax.set_yticks(list(range(len(studies))) + [y],
                      [plain(s["label"]) for s in studies] + ["pooled (random effects)"], fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(plain(title), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plain(text: str) -> str:
    """Untrusted text for a matplotlib label (no mathtext)."""
    return str(text).replace("$", r"\$")


def largest_stable_lr(runs, key: str = STABILITY_KEY) -> dict[tuple[str, str], dict]:
    """Per (board title, variant) of runs with ``key`` in their overrides: the largest learning rate searched at
    which no run diverged and at least one finished (None if none), the largest searched, and the divergences.
    ``runs``: (title, RunResult) pairs."""
    by: dict[tuple[str, str], dict[float, list]] = defaultdict(lambda: defaultdict(list))
    for title, r in runs:
        value = r.overrides.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            by[(title, r.variant)][float(value)].append(r)
    out = {}
    for group, rates in by.items():
        stable = [lr for lr, rs in rates.items() if not any(r.status == "diverged" for r in rs)
                  and any(r.status in ("ok", "diverged") for r in rs)]
        out[group] = {"largest": max(stable) if stable else None, "searched": max(rates),
                      "diverged": sum(r.status == "diverged" for rs in rates.values() for r in rs),
                      "runs": sum(len(rs) for rs in rates.values())}
    return out


# ---- the leaderboard's sections ---------------------------------------------------------------------------------

def comparisons(boards, deltas: dict[str, dict[str, dict]]) -> dict[tuple[str, str], tuple[list[float], bool]]:
    """Every comparison on a page: per (board title, variant) its paired differences to softmax on the board's
    primary metric and the metric's direction. ``deltas[title][variant]`` (``stats.paired_difference``) where the
    board has them (a tuned or confirming suite), else the board's pooled rows. Binary primaries are left out (their
    test is McNemar's)."""
    out = {}
    for b in boards:
        if b.binary:
            continue
        chosen = deltas.get(b.title) or {r["variant"]: r.get("delta") for r in b.rows()}
        for variant, d in chosen.items():
            if d and d.get("diffs"):
                out[(b.title, variant)] = (list(d["diffs"]), b.higher)
    return out


def decide_page(boards, deltas: dict[str, dict[str, dict]]) -> dict[tuple[str, str], dict]:
    """``stats.decide`` over every comparison on the page (``comparisons``), by (board title, variant)."""
    from quest_bench.stats import decide

    comps = comparisons(boards, deltas)
    return decide({k: d for k, (d, _) in comps.items()}, {k: h for k, (_, h) in comps.items()})


def verdict_section(comps: dict[tuple[str, str], tuple[list[float], bool]], source: str) -> list[str]:
    """The decision rule (``stats.decide``) over every comparison on the page, as a table."""
    from quest_bench.report_tables import Num, Table, Text
    from quest_bench.stats import ALPHA, MIN_PAIRS_FOR_VERDICT, POWER, decide, format_p

    if not comps:
        return []
    out = decide({k: d for k, (d, _) in comps.items()}, {k: h for k, (_, h) in comps.items()})
    family = sum(v["verdict"] != "no verdict" for v in out.values())
    lines = ["## Verdicts (one decision rule)", "",
             f"Each variant against `{BASELINE}` on each task's primary metric ({source}). With n ≥ "
             f"{MIN_PAIRS_FOR_VERDICT} pairs the paired t test decides, its p Holm-corrected over the "
             f"{family} such comparison{'' if family == 1 else 's'} on this page; the interval is the t interval at "
             f"the level Holm gives the comparison, so it excludes 0 exactly when the mark * is set. The exact "
             f"sign-flip p is a robustness check. MDE: the "
             f"smallest true Δ the t test detects with {POWER:.0%} power at two-sided α = {ALPHA} with these n and "
             f"this spread. Δ > 0 means a larger metric; the verdict says better or worse. See docs/statistics.md.",
             ""]
    table = Table([Text(c) for c in ("task", "variant", "n", "Δ [interval]", "t p (Holm)", "sign-flip p", "MDE",
                                     "verdict")])
    for (title, variant), v in out.items():
        interval = f"{v['mean']:+.3g} [{v['ci_low']:+.3g}, {v['ci_high']:+.3g}]" if math.isfinite(v["ci_low"]) \
            else f"{v['mean']:+.3g}"
        holm_p = f" (Holm {v['p_holm']:.2g})" if math.isfinite(v["p_holm"]) else ""
        table.rows.append([title, variant, v["n"],
                           number_or_text(v["mean"], interval, {"mean": v["mean"], "low": v["ci_low"],
                                                                "high": v["ci_high"]}),
                           number_or_text(v["p"], f"{format_p(v['p']).removeprefix('p = ')}{holm_p}",
                                          {"p": v["p"], "p_holm": v["p_holm"]}),
                           number_or_text(v["p_sign_flip"],
                                          format_p(v["p_sign_flip"], v["sign_flip_floor"]).replace("p = ", ""),
                                          {"p": v["p_sign_flip"]}),
                           Num(v["mde"], f"{v['mde']:.3g}"), Text(f"{v['words']}{' *' if v['mark'] else ''}")])
    return lines + [table, ""]


def number_or_text(value: float, text: str, data: dict | None = None):
    """A cell that shows ``text``: the number ``value`` where the text is just that number rounded (its data files
    get the number), else the text (an interval, a bound such as "≤ 1e-05", a Holm p beside it) carrying the
    numbers ``data`` (default: ``value``) for the data files."""
    from quest_bench.report_tables import Num, Text

    try:
        float(text)
    except ValueError:
        return Text(text, data=data if data is not None else {"value": value})
    return Num(value, text)


def cross_domain_section(comps: dict[tuple[str, str], tuple[list[float], bool]], folder: Path, label: str,
                         stem: str, colors=None) -> list[str]:
    """Per variant, the random-effects estimate of the standardised effect over tasks, a table and a forest plot
    ``<stem>.png`` in ``folder``; nothing when no variant has 2 tasks with an effect."""
    from quest_bench.report_tables import Num, Table, Text

    studies: dict[str, list[dict]] = defaultdict(list)
    for (title, variant), (diffs, higher) in comps.items():
        effect = standardised_effect(diffs, higher)
        if math.isfinite(effect["g"]):
            studies[variant].append({"label": title, **effect})
    pooled = {v: dersimonian_laird([s["g"] for s in ss], [s["se"] for s in ss]) for v, ss in studies.items()}
    panels = {v: (studies[v], pooled[v]) for v in studies if pooled[v]["k"] >= 2}
    if not panels:
        return []
    forest_plot(panels, Path(folder) / f"{stem}.png", f"{label}: standardised paired effect per task", colors)
    lines = [f"## Across domains: {label}", "",
             f"Per task, the standardised paired effect g (Hedges-corrected d_z = mean Δ / sd of Δ, > 0 = better "
             f"than `{BASELINE}`) with its standard error; combined over tasks by a DerSimonian–Laird random-effects "
             "meta-analysis. τ²: the between-task variance of the true effects; I²: the share of the spread that is "
             "heterogeneity rather than noise. A pooled effect says how large the typical effect is across these "
             "tasks, not that every task has it.", ""]
    table = Table([Text(c) for c in ("variant", "tasks", "pooled g [95%]", "p", "τ²", "I²", "per task: g [95%]")])
    for v, (ss, p) in panels.items():
        per = Text("; ".join("{} " + f"{s['g']:+.2f} [{s['ci_low']:+.2f}, {s['ci_high']:+.2f}]" for s in ss),
                   *(s["label"] for s in ss),
                   data={f"{s['label']} {k}": s[key] for s in ss
                         for k, key in (("g", "g"), ("low", "ci_low"), ("high", "ci_high"))})
        table.rows.append([v, p["k"], Text(f"{p['pooled']:+.2f} [{p['ci_low']:+.2f}, {p['ci_high']:+.2f}]",
                                           data={"g": p["pooled"], "low": p["ci_low"], "high": p["ci_high"]}),
                           Num(p["p"], f"{p['p']:.2g}"), Num(p["tau2"], f"{p['tau2']:.3g}"),
                           Num(p["i2"], f"{p['i2']:.0%}"), per])
    return lines + [table, "", f"![{stem}.png]({stem}.png)", ""]


def stability_section(boards) -> list:
    """The largest value of each task's stability axis (its declared grid key, e.g. the learning rate) at which no
    seed diverged, per task and variant (boards whose runs search that key)."""
    from quest_bench.leaderboard import md, md_code
    from quest_bench.report_tables import Table, Text

    table, axes = {}, {}
    for b in boards:
        axis = b.conventions.stability_axis
        found = largest_stable_lr([(b.title, r) for r in b.runs], axis) if axis else {}
        table.update(found)
        if found:
            axes.setdefault(axis, []).append(b.title)
    if not table:
        return []
    variants = sorted({v for _, v in table}, key=lambda v: (v != BASELINE, v))
    named = "; ".join(f"`{md_code(axis)}` ({', '.join(map(md, titles))})" for axis, titles in axes.items())
    out = Table([Text("task"), *variants])
    lines = ["## Stability: the largest value of the stability axis at which no seed diverged", "",
             f"Per task and variant, over every run that sets the task's stability axis ({named}): the largest value "
             "searched at which no run diverged (≥ when it is the largest searched: the limit lies beyond the "
             "search); in brackets the diverged runs of all runs.", "", out]
    for title in dict.fromkeys(t for t, _ in table):
        cells = []
        for v in variants:
            s = table.get((title, v))
            if s is None:
                cells.append(Text("—"))
                continue
            largest = "none" if s["largest"] is None else \
                ("≥ " if s["largest"] == s["searched"] else "") + f"{s['largest']:g}"
            cells.append(Text(f"{largest} ({s['diverged']}/{s['runs']})"))
        out.rows.append([title, *cells])
    counts = stability_against_baseline(table)
    if counts:
        lines += ["", f"Against `{BASELINE}`, task by task (a count, no test): " + "; ".join(
            f"{md(v)} higher on {c['higher']}, the same on {c['same']}, lower on {c['lower']} of {c['tasks']} tasks"
            + (f" ({c['beyond']} more where both were stable at every rate searched)" if c["beyond"] else "")
            for v, c in counts.items()) + "."]
    return lines + [""]


def stability_against_baseline(table: dict[tuple[str, str], dict]) -> dict[str, dict[str, int]]:
    """Per variant, over the tasks it shares with softmax in ``largest_stable_lr``'s table: on how many its largest
    stable rate is higher, the same or lower than softmax's ("none" is lowest); tasks where both were stable at the
    largest rate searched count apart (``beyond``: the search cannot order them)."""
    out: dict[str, dict[str, int]] = {}
    for (title, variant), s in table.items():
        base = table.get((title, BASELINE))
        if variant == BASELINE or base is None:
            continue
        c = out.setdefault(variant, {"higher": 0, "same": 0, "lower": 0, "beyond": 0, "tasks": 0})
        ours, theirs = (x["largest"] if x["largest"] is not None else -math.inf for x in (s, base))
        if ours == s["searched"] and theirs == base["searched"]:
            c["beyond"] += 1
            continue
        c["tasks"] += 1
        c["higher" if ours > theirs else "lower" if ours < theirs else "same"] += 1
    return out


def page_sections(boards, deltas: dict[str, dict[str, dict]], folder: Path | None, source: str,
                  colors=None) -> list[str]:
    """The leaderboard's verdict, cross-domain and stability sections for ``boards``."""
    comps = comparisons(boards, deltas)
    lines = verdict_section(comps, source)
    if folder is not None:
        lines += cross_domain_section(comps, folder, "primary metric", "forest-primary", colors)
        robust = {}
        for b in boards:
            if b.corruptions() and BASELINE in b.variants:
                from quest_bench.stats import paired_difference

                base = b.mce(BASELINE)
                for v in b.variants:
                    if v != BASELINE:
                        d = paired_difference(b.mce(v), base)
                        if d["n_pairs"]:
                            robust[(b.title, v)] = (d["diffs"], False)  # mCE: lower is better
        lines += cross_domain_section(robust, folder, "robustness (mCE, paired on seed and cell over all runs)",
                                      "forest-robustness", colors)
    return lines + stability_section(boards)
