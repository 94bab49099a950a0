"""Tune, then confirm: ties in grid order, the confirm key, stage 2's fresh seeds at each variant's chosen cell, and
a sweep that runs stage 2 once stage 1 has finished and resumes when interrupted (Ray and training replaced by a
deterministic fake, so that the protocol, not the model, is under test)."""

import contextlib
import math
from pathlib import Path

import pytest

import quest_bench.sweep as sweep
from quest_bench import tuning
from quest_bench.result import RunResult
from quest_bench.store import Store
from quest_bench.suite import load_suite

BEST_LOG_LR = {"softmax": -3.0, "quest": -2.0}  # the fake's optimum per variant: softmax at 1e-3, quest at 1e-2


def result(task="spurious", variant="quest", seed=0, overrides=None, val=0.5, test=0.5, status="ok", run_id=None):
    overrides = overrides or {}
    return RunResult(run_id=run_id or f"{variant}-{seed}-{sorted(overrides.items())}", task=task, task_version="1",
                     variant=variant, preset="tiny", seed=seed, overrides=overrides, status=status,
                     metrics={"robust_success": test, "val_score": val}, primary_metric="robust_success",
                     validation_metric="val_score")


def test_ties_go_to_the_first_cell_in_grid_order_whatever_the_results_order():
    # cells 1e-3 and 4e-3 tie: the same three validation values by seed, summed in another order
    # (0.1 + 0.2 + 0.3 = 0.6000000000000001, 0.3 + 0.2 + 0.1 = 0.6); 2e-3 is worse
    values = {0.001: (0.1, 0.2, 0.3), 0.002: (0.0, 0.1, 0.2), 0.004: (0.3, 0.2, 0.1)}
    runs = [result(seed=s, overrides={"lr": lr}, val=v) for lr, vals in values.items() for s, v in enumerate(vals)]
    for ordered in (runs, runs[::-1]):
        options = tuning.choices(ordered, ("lr",), "val_score")
        assert [c.cell["lr"] for c in options] == [0.001, 0.002, 0.004]  # ascending without a declared order
        assert tuning.best(options, higher_is_better=True).cell == {"lr": 0.001}
        declared = [{"lr": 0.004}, {"lr": 0.002}, {"lr": 0.001}]  # a grid written from the largest rate down
        assert tuning.best(tuning.choices(ordered, ("lr",), "val_score", declared), True).cell == {"lr": 0.004}
    # lower is better: 2e-3 wins outright, whatever the order
    assert tuning.best(tuning.choices(runs[::-1], ("lr",), "val_score"), False).cell == {"lr": 0.002}


def write_suite(folder: Path, confirm: str, seeds="[0, 1, 2]", variants="[softmax, quest]", tune="tune: [lr]") -> Path:
    path = folder / "confirmed.yaml"
    path.write_text(f"name: confirmed\ntasks: [spurious]\nvariants: {variants}\npresets: [tiny]\nseeds: {seeds}\n"
                    f"overrides: {{steps: 20, warmup_steps: 2}}\ngrid: {{lr: [0.001, 0.01]}}\n{tune}\n{confirm}\n")
    return path


def test_the_confirm_key_gives_fresh_seeds_and_refuses_what_cannot_confirm(tmp_path):
    suite = load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}")))
    assert suite.confirm == tuple(range(3, 13))  # the 10 integers after stage 1's largest seed
    assert len(suite.specs) == 2 * 2 * 3  # stage 1 only: variants × cells × seeds
    listed = load_suite(str(write_suite(tmp_path, f"confirm: {{seeds: {list(range(100, 110))}}}")))
    assert listed.confirm == tuple(range(100, 110))
    bad = {"confirm: {seeds: [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}": r"confirm seeds \[2\] are also stage-1 seeds",
           "confirm: {seeds: 5}": r"at least 10 distinct seeds",
           "confirm: {runs: 10}": r"'confirm' is a mapping with one key, 'seeds'",
           "confirm: {seeds: ten}": r"a count or a list of integers >= 0"}
    for text, message in bad.items():
        with pytest.raises(ValueError, match=message):
            load_suite(str(write_suite(tmp_path, text)))
    with pytest.raises(ValueError, match=r"needs at least 3 stage-1 seeds per cell, got 2"):
        load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}", seeds="[0, 1]")))
    with pytest.raises(ValueError, match=r"needs the variant 'softmax'"):
        load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}", variants="[quest, qknorm]")))
    with pytest.raises(ValueError, match=r"'confirm' needs 'tune'"):
        load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}", tune="")))


def fake_result(spec) -> RunResult:
    """A deterministic outcome: the validation and test metrics peak at the variant's BEST_LOG_LR, plus a seed term."""
    bump = -(math.log10(spec.overrides["lr"]) - BEST_LOG_LR[spec.variant]) ** 2
    noise = 0.01 * ((spec.seed * 7) % 5)
    return result(spec.task, spec.variant, spec.seed, dict(spec.overrides), 0.8 + 0.1 * bump + noise,
                  0.7 + 0.1 * bump + noise, run_id=spec.run_id)


def test_stage_two_is_each_variants_chosen_cell_with_seeds_disjoint_from_stage_one(tmp_path):
    suite = load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}")))
    stage_one = [fake_result(s) for s in suite.specs]
    specs, notes = tuning.confirmation_specs(suite, stage_one[:-1])  # one stage-1 run missing: nothing yet
    assert specs == [] and "waits for stage 1: 1 of 12 runs not finished" in notes[0]
    specs, notes = tuning.confirmation_specs(suite, stage_one)
    assert notes == [] and len(specs) == 2 * 10
    for variant, lr in (("softmax", 0.001), ("quest", 0.01)):
        mine = [s for s in specs if s.variant == variant]
        assert {s.overrides["lr"] for s in mine} == {lr} and all(s.overrides["steps"] == 20 for s in mine)
        assert sorted(s.seed for s in mine) == list(range(3, 13))
    assert not {s.seed for s in specs} & {s.seed for s in suite.specs}  # fresh seeds
    assert not {s.run_id for s in specs} & {s.run_id for s in suite.specs}
    # a variant whose every cell has a diverged seed gets no stage 2, and says so
    diverged = [result(r.task, r.variant, r.seed, r.overrides, status="diverged", run_id=r.run_id)
                if r.variant == "quest" and r.seed == 0 else r for r in stage_one]
    specs, notes = tuning.confirmation_specs(suite, diverged)
    assert {s.variant for s in specs} == {"softmax"} and "no run for spurious/tiny/quest" in notes[0]


def test_a_sweep_runs_stage_two_once_stage_one_has_finished_and_resumes(tmp_path, monkeypatch):
    suite = load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}")))
    executed, budget = [], {"runs": 0}

    @contextlib.contextmanager
    def no_ray(address, max_retries):
        yield type("FakeRay", (), {"nodes": staticmethod(lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])})

    def run_specs(ray, todo, places, store, counts, *args):
        for spec in todo:
            if budget["runs"] == 0:
                raise KeyboardInterrupt  # interrupted mid-stage, like Ctrl-C
            budget["runs"] -= 1
            sweep.write_run(store, spec, fake_result(spec), None)
            counts["ok"] += 1
            executed.append(spec)

    monkeypatch.setattr(sweep, "ray_session", no_ray)
    monkeypatch.setattr(sweep, "run_specs", run_specs)
    results = tmp_path / "results"
    budget["runs"] = 7  # stops in stage 1
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(suite, results, progress=False)
    assert len(executed) == 7 and all(s.seed < 3 for s in executed)
    budget["runs"] = 10  # finishes stage 1 (5 left), then stops in stage 2
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(suite, results, progress=False)
    assert len(executed) == 17 and all(s.seed >= 3 for s in executed[12:])
    budget["runs"] = 100
    counts = sweep.run_sweep(suite, results, progress=False)  # resumes stage 2 only
    assert counts["ok"] == 15 and len(executed) == 32
    stage_two = executed[12:]
    assert len({s.run_id for s in stage_two}) == 20  # no stage-2 run ran twice
    assert {(s.variant, s.overrides["lr"]) for s in stage_two} == {("softmax", 0.001), ("quest", 0.01)}
    counts = sweep.run_sweep(suite, results, progress=False)  # everything finished: nothing runs
    assert counts["ok"] == 0 and len(executed) == 32 and counts["skipped"] == 32
    stored = Store(results / "confirmed").scan(warn=False)[0]
    assert len(stored) == 32


def test_the_leaderboard_chooses_on_stage_one_reports_stage_two_and_decides_across_the_page(tmp_path, monkeypatch):
    from quest_bench.cli import main

    path = write_suite(tmp_path, "confirm: {seeds: 10}")
    suite = load_suite(str(path))
    results = tmp_path / "results"
    store = Store(results / "confirmed")
    stage_two, _ = tuning.confirmation_specs(suite, [fake_result(s) for s in suite.specs])
    for spec in [*suite.specs, *stage_two]:
        store.write(spec, fake_result(spec))
    assert main(["leaderboard", "--suite", str(path), "--results", str(results), "--out", str(tmp_path / "lb")]) == 0
    text = (tmp_path / "lb" / "README.md").read_text()
    assert "32 runs" in text  # stage 2's runs belong to the suite as defined
    tuned = text.split("**Equal tuning budget**")[1].split("\n\n")[1]
    softmax_row = next(line for line in tuned.splitlines() if line.startswith("| softmax"))
    quest_row = next(line for line in tuned.splitlines() if line.startswith("| quest"))
    assert "lr=0.001" in softmax_row and "lr=0.01" in quest_row and "(10)" in quest_row  # stage 2's n
    assert quest_row.endswith("0 / 0 of 6 |")  # the search: 2 cells × 3 seeds, stage 2 not counted
    # the tuned table's Δ at the best cell is the mean alone: the Verdicts section's interval and p decide it
    assert "(n=10; decided in Verdicts)" in quest_row and "sign-flip" not in quest_row and "[" not in quest_row
    verdicts = text.split("## Verdicts (one decision rule)")[1].split("\n## ")[0]
    row = next(line for line in verdicts.splitlines() if line.startswith("| spurious (tiny) | quest"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "10"  # n: stage 2 only, paired by seed with softmax at its own cell
    # the fake's quest and softmax share each seed's noise: Δ = 0 on every pair, so the verdict is "within"
    assert cells[-1].startswith("not significant: Δ +0 within [+0, +0]")


def test_verdicts_and_the_forest_plot_across_two_tasks(tmp_path):
    from quest_bench.leaderboard import write_leaderboard
    from quest_bench.runs import RunSet

    rng = __import__("numpy").random.default_rng(3)
    runs = RunSet()
    for task, shift in (("taska", 0.05), ("taskb", 0.01)):
        for seed in range(10):
            noise = float(rng.normal(0, 0.01))
            for variant, value in (("softmax", 0.5 + noise), ("quest", 0.5 + shift + noise + float(rng.normal(0, 0.01)))):
                r = result(task, variant, seed, {}, value, value, run_id=f"{task}-{variant}-{seed}")
                runs.add(r, tmp_path / r.run_id, "s")
    folder = write_leaderboard(runs, "s", folder=tmp_path / "lb")
    text = (folder / "README.md").read_text()
    verdicts = text.split("## Verdicts (one decision rule)")[1].split("\n## ")[0]
    assert "over the 2 such comparisons" in verdicts
    for task in ("taska", "taskb"):  # shifts of 5 and 1 sd of the seed noise, n = 10 each: both detected
        row = next(line for line in verdicts.splitlines() if line.startswith(f"| {task} (tiny) | quest | 10 |"))
        assert row.split("|")[-2].strip().startswith("better: Δ +0.0") and row.endswith("* |")
    assert "## Across domains: primary metric" in text and (folder / "forest-primary.png").is_file()
    summary = text.split("## Summary: Δ vs softmax")[1].split("\n## ")[0]  # the same rule marks the summary
    for task in ("taska", "taskb"):
        row = next(line for line in summary.splitlines() if line.startswith(f"| {task} (tiny)"))
        assert "(t p " in row and row.endswith("* |")


def test_a_dry_run_plans_stage_two_once_stage_one_has_finished(tmp_path):
    suite = load_suite(str(write_suite(tmp_path, "confirm: {seeds: 10}")))
    results = tmp_path / "results"
    plan = sweep.dry_run(suite, results)
    assert "12 to run" in plan and "= 20 runs, planned once every stage-1 run has finished" in plan
    store = Store(results / "confirmed")
    for spec in suite.specs:
        store.write(spec, fake_result(spec))
    plan = sweep.dry_run(suite, results)
    assert "= 20 runs, listed below" in plan and "to run: 20 runs" in plan
    assert "quest/tiny/seed3[lr=0.01," in plan and "softmax/tiny/seed12[lr=0.001," in plan
