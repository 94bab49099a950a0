"""Unit tests of the runner's parts: specs, configs, statistics, the store, the context."""

import json
import re
import sqlite3
import subprocess
import sys

import pytest

from quest_bench.registry import get_task, task_names
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store
from quest_sdk.task import Diverged, RunContext


def test_run_id_is_a_stable_hash_of_spec_and_code_version():
    a = RunSpec("spurious", "quest", "tiny", 0, {"lr": 0.01, "steps": 5}, "v1")
    assert a.run_id == RunSpec("spurious", "quest", "tiny", 0, {"steps": 5, "lr": 0.01}, "v1").run_id
    assert len(a.run_id) == 16
    for other in (RunSpec("spurious", "quest", "tiny", 1, {"lr": 0.01, "steps": 5}, "v1"),
                  RunSpec("spurious", "softmax", "tiny", 0, {"lr": 0.01, "steps": 5}, "v1"),
                  RunSpec("spurious", "quest", "tiny", 0, {"lr": 0.01, "steps": 5}, "v2")):
        assert other.run_id != a.run_id
    assert RunSpec.from_json(a.to_json()) == a


def test_registry_lists_spurious_and_suggests_on_typos():
    assert "spurious" in task_names()
    with pytest.raises(ValueError, match=r"unknown task 'spurios'.*Did you mean 'spurious'"):
        get_task("spurios")


def test_task_config_validation():
    task = get_task("spurious")
    cfg = task.make_config("tiny", {"lr": "0.01", "steps": "7", "warmup_steps": "2", "decay_query_and_scales": "false"})
    assert (cfg.lr, cfg.steps, cfg.decay_query_and_scales) == (0.01, 7, False)
    with pytest.raises(ValueError, match="no preset 'huge'; valid presets: tiny, small, paper"):
        task.make_config("huge", {})
    with pytest.raises(ValueError, match="no config key 'lrate'; valid keys: .*lr"):
        task.make_config("tiny", {"lrate": 1})
    with pytest.raises(ValueError, match="expects int, got 'many'"):
        task.make_config("tiny", {"steps": "many"})
    with pytest.raises(ValueError, match="expects int, got 3.5"):
        task.make_config("tiny", {"steps": 3.5})
    with pytest.raises(ValueError, match="expects bool, got 'maybe'"):
        task.make_config("tiny", {"decay_query_and_scales": "maybe"})
    assert task.make_config("tiny", {"lr": 1, "steps": "12", "warmup_steps": 2}).lr == 1.0


def make_result(run_id, variant="quest", status="ok", value=1.0):
    return RunResult(run_id=run_id, task="spurious", task_version="1", variant=variant, preset="tiny", seed=0,
                     overrides={}, status=status, metrics={"robust_success": value}, primary_metric="robust_success")


def test_store_roundtrip_rebuild_and_corrupt_folders(tmp_path, capsys):
    store = Store(tmp_path / "suite")
    specs = [RunSpec("spurious", v, "tiny", 0, {}, "x") for v in ("quest", "softmax", "qnorm")]
    for spec, status in zip(specs, ("ok", "diverged", "failed")):
        store.write(spec, make_result(spec.run_id, spec.variant, status))
    assert store.finished_ids() == {specs[0].run_id, specs[1].run_id}  # failed runs are run again
    corrupt = store.runs_dir / "deadbeefdeadbeef"
    corrupt.mkdir()
    (corrupt / "result.json").write_text("{not json")
    store.db_path.unlink()
    problems = store.rebuild()
    assert len(problems) == 1 and "deadbeefdeadbeef" in problems[0]
    assert "skipping corrupt run folder" in capsys.readouterr().err
    assert sorted(r.variant for r in store.load()) == ["qnorm", "quest", "softmax"]
    loaded = json.loads((store.run_dir(specs[0].run_id) / "spec.json").read_text())
    assert loaded["run_id"] == specs[0].run_id


def test_load_indexes_a_result_whose_database_row_was_never_written(tmp_path):
    """A driver killed between os.replace(result.json) and the INSERT: the folder wins on the next read."""
    store = Store(tmp_path / "suite")
    first, second = (RunSpec("spurious", v, "tiny", 0, {}, "x") for v in ("quest", "softmax"))
    store.write(first, make_result(first.run_id, "quest"))
    folder = store.run_dir(second.run_id)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(make_result(second.run_id, "softmax").to_json())
    assert store.finished_ids() == {first.run_id, second.run_id}
    assert {r.run_id for r in store.load()} == {first.run_id, second.run_id}
    with sqlite3.connect(store.db_path) as con:
        rows = sorted(r[0] for r in con.execute("SELECT run_id FROM runs"))
    assert rows == sorted([first.run_id, second.run_id])


def test_context_detects_divergence(tmp_path):
    ctx = RunContext(tmp_path, "quest", max_logit=100.0)
    ctx.check(0, 1.0, {"max_logit": 5.0})
    with pytest.raises(Diverged, match="step 3: loss is nan"):
        ctx.check(3, float("nan"))
    with pytest.raises(Diverged, match="max attention logit 1e\\+03 > 100"):
        ctx.check(4, 1.0, {"max_logit": 1000.0})
    ctx.log(1, {"loss": 2.0})
    ctx.close()
    assert json.loads((tmp_path / "events.jsonl").read_text()) == {"step": 1, "loss": 2.0}


def test_leaderboard_tables_deltas_and_stale_runs(tmp_path):
    from quest_bench.leaderboard import write_leaderboard

    store = Store(tmp_path / "suite")
    current = set()
    for seed, (soft, quest) in enumerate([(0.5, 0.7), (0.6, 0.9), (0.4, 0.6)]):
        for variant, value in (("softmax", soft), ("quest", quest)):
            spec = RunSpec("spurious", variant, "tiny", seed, {}, "v2")
            result = make_result(spec.run_id, variant, value=value)
            result.seed = seed
            store.write(spec, result)
            current.add(spec.run_id)
    stale = RunSpec("spurious", "quest", "tiny", 0, {}, "v1")
    store.write(stale, make_result(stale.run_id, "quest", value=-100.0))
    diverged = RunSpec("spurious", "quest", "tiny", 9, {}, "v2")
    store.write(diverged, make_result(diverged.run_id, "quest", status="diverged", value=float("nan")))
    current.add(diverged.run_id)

    folder = write_leaderboard(store, "suite", current)
    md = (folder / "README.md").read_text()
    assert "1 runs in the results folder are not part of the suite" in md
    assert "| softmax | 3 | 0.500 ± 0.100 | — |" in md
    # quest − softmax = +0.2, +0.3, +0.2 on the same seeds: with 3 pairs the per-pair differences and the exact
    # sign-flip p (2/8); the diverged run is counted, not averaged
    assert ("| quest | 3 | 0.733 ± 0.153 | +0.233 (n=3: +0.200, +0.300, +0.200; sign-flip p=0.25, Holm 0.25) | 1 | 0 |"
            in md)
    # a win needs 6 paired runs with 2 variants (2/2^n < 0.05): not computed rather than a table of ties
    assert "Not computed: with 2 variants a win" in md and "needs at least 6 paired runs" in md
    assert (folder / "spurious-tiny-bars.png").stat().st_size > 1000


def test_leaderboard_mce_relative_to_softmax(tmp_path):
    """mCE per run against softmax's mean error per corruption: softmax's own runs scatter around 100 (seed noise)
    and each variant is paired with softmax on the seed. By hand: softmax's fog error is 2.0 and 2.4 on seeds 0 and
    1 (mean 2.2), noise 1.0: its runs are (2/2.2 + 1)/2 = 95.45 and (2.4/2.2 + 1)/2 = 104.55; quest's
    (1/2.2 + 0.75)/2 = 60.23 on both; paired differences -35.23 and -44.32."""
    from quest_bench.leaderboard import write_leaderboard

    store = Store(tmp_path / "suite")
    errors = {"softmax": ({"fog": 2.0, "noise": 1.0}, {"fog": 2.4, "noise": 1.0}),
              "quest": ({"fog": 1.0, "noise": 0.75}, {"fog": 1.0, "noise": 0.75})}
    for variant, per_seed in errors.items():
        for seed, errs in enumerate(per_seed):
            spec = RunSpec("image-cls", variant, "tiny", seed, {}, "v1")
            result = make_result(spec.run_id, variant, value=0.9)
            result.task, result.seed = "image-cls", seed
            result.metrics.update({f"corruption_error/{c}": e for c, e in errs.items()})
            store.write(spec, result)
    board = write_leaderboard(store, "suite")
    md = (board / "README.md").read_text()
    assert "| variant | mCE vs softmax (%) ↓ | Δ mCE (paired) |" in md  # its own table, after the task's runs table
    assert "| softmax | 100.0 ± 6.4 (n=2) | — |" in md  # the reference, with its own noise
    assert "| quest | 60.2 ± 0.0 (n=2) | -39.773 (n=2: -35.227, -44.318; sign-flip p=0.5) |" in md
    mce = json.loads(next((board / "tables").glob("*-image-cls_tiny-mCE.json")).read_text())
    assert [(r["variant"], round(r["mCE vs softmax (%) ↓: mean"], 1)) for r in mce] == [("softmax", 100.0),
                                                                                          ("quest", 60.2)]
    assert "needs at least 6 paired runs per comparison, and these boards have at most 2" in md


def test_a_rerun_keeps_the_run_s_own_files_and_drops_the_failed_attempt_s_error(tmp_path):
    from quest_bench.sweep import write_run

    store = Store(tmp_path / "suite")
    spec = RunSpec("spurious", "quest", "tiny", 0, {}, "x")
    folder = store.run_dir(spec.run_id)
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text('{"step": 1}\n')  # written by the run itself while it trained
    write_run(store, spec, make_result(spec.run_id, "quest", status="failed"), "Traceback ...")
    assert (folder / "error.txt").read_text() == "Traceback ...\n"
    assert [r.status for r in store.load()] == ["failed"]
    write_run(store, spec, make_result(spec.run_id, "quest"), None)
    assert not (folder / "error.txt").exists()
    assert (folder / "events.jsonl").read_text() == '{"step": 1}\n'
    assert [r.status for r in store.load()] == ["ok"]


def test_leaderboard_page_summary_provenance_tables_and_a_copyable_folder(tmp_path):
    import shutil

    from quest_bench.leaderboard import write_leaderboard

    store = Store(tmp_path / "results" / "suite")
    for seed, (soft, quest) in enumerate([(0.50, 0.61), (0.52, 0.60), (0.48, 0.64)]):
        for variant, value in (("softmax", soft), ("quest", quest)):
            spec = RunSpec("lm", variant, "tiny", seed, {}, "x")
            result = RunResult(run_id=spec.run_id, task="lm", task_version="1", variant=variant, preset="tiny",
                               seed=seed, overrides={}, status="ok", metrics={"valid_ppl": value},
                               primary_metric="valid_ppl", higher_is_better=False,
                               env={"git_sha": "abc123def4567890", "host": "node1", "device": "cpu",
                                    "torch_threads": 1, "packages": {"torch": "2.11.0"}},
                               cost={"wall_s": 1800.0}, finished_at=f"2026-12-0{seed + 1}T00:00:00+00:00")
            store.write(spec, result)
            (store.run_dir(spec.run_id) / "attention.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # a per-run figure
    folder = write_leaderboard(store, "suite")
    md = (folder / "README.md").read_text()
    summary = md[md.index("## Summary: Δ vs softmax"):md.index("## lm (tiny)")]
    assert "| lm (tiny) | valid_ppl ↓ | +0.117 (p 0.25, n=3) |" in summary  # quest - softmax, 3 pairs: p = 2/8
    assert "| code (git) | abc123def456 |" in md and "wall times) | 3.00 |" in md and "node1 (cpu, 1 threads)" in md
    assert "| finished | 2026-12-01T00:00:00+00:00 to 2026-12-03T00:00:00+00:00 |" in md
    tables = sorted(p.name for p in (folder / "tables").iterdir())
    assert tables == ["01-Summary_vs_softmax.csv", "01-Summary_vs_softmax.json", "02-Verdicts_one_decision_rule.csv",
                      "02-Verdicts_one_decision_rule.json", "03-lm_tiny-runs.csv", "03-lm_tiny-runs.json",
                      "04-Provenance.csv", "04-Provenance.json", "results.csv", "results.json"]  # the numbers as numbers
    assert "no verdict: n = 3 < 10 pairs" in md  # the decision rule's table: 3 pairs decide nothing
    rows = json.loads((folder / "tables" / "03-lm_tiny-runs.json").read_text())
    assert [r["variant"] for r in rows] == ["softmax", "quest"] and rows[1]["n"] == 3  # a number, not "3"
    page = (folder / "index.html").read_text()
    assert "`" not in page and "<code>valid_ppl</code>" in page
    copied = tmp_path / "elsewhere"
    shutil.copytree(folder, copied)
    shutil.rmtree(tmp_path / "results")  # the run folders are gone: the copied page must not need them
    links = [line for line in (copied / "README.md").read_text().splitlines() if line.startswith("Per-run figures")]
    targets = re.findall(r"\]\(([^)]+)\)", links[0])
    assert targets and all((copied / t).is_file() for t in targets)


@pytest.mark.slow
def test_the_leaderboard_page_passes_a_real_headless_browser_and_the_check_catches_faults(tmp_path):
    from quest_bench.leaderboard import write_leaderboard
    from quest_bench.pagecheck import check_page

    store = Store(tmp_path / "results" / "suite")
    for seed in range(2):
        for variant, value in (("softmax", 0.5 + 0.01 * seed), ("quest", 0.6)):
            spec = RunSpec("spurious", variant, "tiny", seed, {}, "x")
            result = make_result(spec.run_id, variant, value=value)
            result.seed = seed
            store.write(spec, result)
    assert check_page(write_leaderboard(store, "suite") / "index.html") == []
    bad = tmp_path / "bad" / "index.html"
    bad.parent.mkdir()
    bad.write_text("<!doctype html><html><head><title>x</title></head><body><p>a `tick`</p>"
                   "<img alt='gone.png' src='gone.png'><a href='gone.csv'>t</a><script>nope();</script></body></html>")
    problems = check_page(bad)
    assert "image did not load: gone.png" in problems and "broken link: gone.csv" in problems
    assert "literal Markdown backticks in the rendered text" in problems
    assert any("ReferenceError" in p for p in problems)


def test_a_tuned_suite_names_grid_keys_with_at_least_two_values(tmp_path):
    from quest_bench.suite import load_suite

    path = tmp_path / "t.yaml"
    path.write_text("name: t\ntasks: [spurious]\nvariants: [softmax, quest]\nseeds: [0, 1]\ngrid: {lr: [0.01, 0.1]}\n"
                    "tune: [lr]\n")
    suite = load_suite(str(path))
    assert suite.tune == ("lr",) and len(suite.specs) == 8
    path.write_text("name: t\ntasks: [spurious]\nvariants: [softmax]\ngrid: {lr: [0.01]}\ntune: [lr, weight_decay]\n")
    with pytest.raises(ValueError, match=r"tune keys \['lr', 'weight_decay'\] need a grid of at least 2 values"):
        load_suite(str(path))


def test_a_driver_killed_inside_the_index_insert_loses_no_row(tmp_path):
    """Killed inside the INSERT, a driver leaves a hot rollback journal beside the index. The next read rebuilds the
    index; the journal must go with the old file, or the next write rolls it back onto the new index and drops the
    row the rebuild had added."""
    store = Store(tmp_path / "suite")
    first, second, third = (RunSpec("spurious", v, "tiny", 0, {}, "x") for v in ("quest", "softmax", "qknorm"))
    store.write(first, make_result(first.run_id, "quest"))
    folder = store.run_dir(second.run_id)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(make_result(second.run_id, "softmax").to_json())
    killed = subprocess.run([sys.executable, "-c", (
        "import os, sqlite3, sys\n"
        "from pathlib import Path\n"
        "from quest_bench.store import Store\n"
        "con = sqlite3.connect(Store(sys.argv[1]).db_path)\n"
        "con.execute('PRAGMA cache_size = 1')\n"
        "Store._upsert(con, Store._read(Path(sys.argv[2]))[1])\n"
        "con.execute('CREATE TABLE bulk (b BLOB)')  # more than the cache holds: the journal is synced, pages spill\n"
        "con.executemany('INSERT INTO bulk VALUES (?)', [(bytes(4096),)] * 64)\n"
        "os._exit(0)  # no commit: the process dies inside the transaction\n"), str(store.root), str(folder)])
    assert killed.returncode == 0
    journal = store.db_path.with_name(store.db_path.name + "-journal")
    assert journal.is_file() and journal.stat().st_size > 0, "the kill left no journal: the case is not exercised"

    assert {r.run_id for r in store.load(warn=False)} == {first.run_id, second.run_id}
    store.write(third, make_result(third.run_id, "qknorm"))
    with sqlite3.connect(store.db_path) as con:
        rows = sorted(r[0] for r in con.execute("SELECT run_id FROM runs"))
    assert rows == sorted([first.run_id, second.run_id, third.run_id])
