"""`quest-bench publish` and `leaderboard --from`: a suite published as data regenerates the same leaderboard as its
results folder, from the published folder alone; result blocks in the docs are checked against it."""

import json
import math
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quest_bench.cli import main
from quest_bench.publish import TARGET_BYTES, doc_problems, markdown_table, published_runs
from quest_bench.publish import main as publish_main
from quest_bench.result import RunResult
from quest_bench.runs import suite_runs
from quest_bench.spec import RunSpec
from quest_bench.store import Store
from quest_bench.suite import load_suite

REPO = Path(__file__).resolve().parents[3]
SUITE = "pub-suite"  # no suite file: every run stored under the name belongs to it
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201e2b3b1e50000000049454e44ae426082")


def result(spec, status="ok"):
    """A run's result with every field the leaderboard reads (a NaN extra metric too), made up from its spec."""
    task, variant, seed, lr = spec.task, spec.variant, spec.seed, spec.overrides["lr"]
    quality = 0.6 + 0.05 * seed + (0.1 + 0.01 * seed * seed if variant == "quest" else 0.0) - lr
    metrics = {} if status != "ok" else {"acc": quality, "stable": float(lr < 0.1), "val_acc": quality - 0.01,
                                         "corrupted_acc": quality / 2,
                                         "ece": math.nan if seed == 2 else 0.1 + 0.02 * seed + lr}
    return RunResult(
        run_id=spec.run_id, task=task, task_version="3", variant=variant, preset="tiny", seed=seed,
        overrides=spec.overrides, status=status, reason="" if status == "ok" else f"{status} at step 4",
        diverged_step=4 if status == "diverged" else None, metrics=metrics, primary_metric="acc",
        metric_directions={"corrupted_acc": True, "ece": False, "stable": True}, validation_metric="val_acc",
        telemetry={"max_logit": 3.0 + seed}, cost={"wall_s": 10.0 + seed, "peak_rss_mib": 500.0},
        env={"packages": {"quest-core": "0.1.0", "torch": "2.11.0"}, "git_sha": "abc123", "git_dirty": None,
             "host": "node-1", "device": "cpu", "torch_threads": 1, "python": "3.11.9", "data_root": None},
        data={"dataset": "toy", "sha256": "00ff"}, config={"lr": lr, "steps": 5, "width": [8, 8]},
        finished_at=f"2026-01-0{seed + 1}T00:00:00Z")


def store_run(store: Store, spec: RunSpec, status: str = "ok") -> None:
    """A run folder as a sweep leaves it: result, curves (events.jsonl) and, for seed 0, a per-run figure."""
    store.write(spec, result(spec, status))
    folder = store.run_dir(spec.run_id)
    lr = spec.overrides["lr"]
    (folder / "events.jsonl").write_text("".join(
        json.dumps({"step": step, "loss": 2.0 / (step + 1 + spec.seed), "max_logit": 1.0 + step * lr,
                    "note": "not a curve"}) + "\n" for step in range(0, 50, 10)))
    if spec.seed == 0:
        (folder / "attention-map.png").write_bytes(PNG)


def make_results(root: Path) -> None:
    """Two tasks that are not installed × softmax/quest × 3 seeds × 3 learning rates, one diverged and one failed
    run."""
    store = Store(root / SUITE)
    for task in ("toy", "toy-b"):
        for variant in ("softmax", "quest"):
            for seed in range(3):
                for lr in (0.01, 0.05, 0.2):
                    status = ("diverged" if (variant, seed, lr) == ("softmax", 1, 0.2) else
                              "failed" if (task, variant, seed, lr) == ("toy-b", "quest", 2, 0.05) else "ok")
                    store_run(store, RunSpec(task, variant, "tiny", seed, {"lr": lr}, "t1"), status)


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The suite's leaderboard built from its results folder, then published; the results folder is then deleted."""
    tmp = tmp_path_factory.mktemp("publish")
    results, docs = tmp / "results", tmp / "docs-results"
    make_results(results)
    assert main(["leaderboard", "--suite", SUITE, "--results", str(results), "--out", str(tmp / "from-results")]) == 0
    assert main(["publish", "--suite", SUITE, "--results", str(results), "--out", str(docs)]) == 0
    stored = {r.run_id: r.to_json() for r in suite_runs(results, SUITE).results}
    shutil.rmtree(results)  # `leaderboard --from` must need nothing else
    return {"tmp": tmp, "folder": docs / SUITE, "stored": stored,
            "from_results": tmp / "from-results"}


def test_leaderboard_from_a_published_suite_equals_the_one_from_its_results(published):
    out = published["tmp"] / "from-published"
    assert main(["leaderboard", "--from", str(published["folder"]), "--out", str(out)]) == 0
    ours, theirs = files(out), files(published["from_results"])
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if ours[name] != theirs[name] and name != "index.html"] == []
    names = set(ours)
    assert {"README.md", "toy-tiny-bars.png", "toy-tiny-curves.png", "toy-tiny-margin.png"} <= names
    assert any(n.startswith("tables/") and n.endswith(".csv") for n in names)
    assert sum(n.startswith("run-figures/") for n in names) == 4  # each task's softmax and quest, seed 0
    assert "softmax" in ours["README.md"].decode() and "| quest |" in ours["README.md"].decode()


def test_the_published_folder_is_the_leaderboard_regenerated_in_place(published):
    folder = published["folder"]
    before = files(folder / "leaderboard")
    assert "index.html" not in before  # published without the page that inlines every figure again
    assert main(["leaderboard", "--from", str(folder)]) == 0  # default --out: its own leaderboard folder
    assert files(folder / "leaderboard") == before
    theirs = files(published["from_results"])
    assert {n: b for n, b in before.items()} == {n: b for n, b in theirs.items() if n != "index.html"}


def test_the_run_table_holds_every_field_and_round_trips_each_result(published, tmp_path):
    folder = published["folder"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["suite"] == SUITE and manifest["runs"] == 36
    assert manifest["status"] == {"diverged": 2, "failed": 1, "ok": 33}
    assert set(manifest["files"]) == {"runs.parquet", "curves.parquet"}
    table = pq.read_table(folder / "runs.parquet")
    assert table.num_rows == 36
    for column in ("run_id", "task", "task_version", "variant", "preset", "seed", "overrides", "status", "metric.acc",
                   "metric.ece", "cost.wall_s", "telemetry.max_logit", "quest_core_version", "git_sha", "config"):
        assert column in table.column_names, column
    assert table.schema.field("seed").type == "int64" and table.schema.field("metric.acc").type == "double"
    assert set(table.column("quest_core_version").to_pylist()) == {"0.1.0"}
    runs, curves, _ = published_runs(folder, tmp_path)
    assert {r.run_id: r.to_json() for r in runs.results} == published["stored"]  # NaN and None included
    loss = curves["toy (tiny)"]["loss"]["quest"]  # the mean over the 9 quest runs of toy at each step
    assert loss[10] == pytest.approx(sum(2.0 / (11 + seed) for seed in range(3)) / 3)
    assert not any(p.name == "events.jsonl" for p in folder.rglob("*"))
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < TARGET_BYTES


def test_a_tuned_suite_regenerates_at_each_variant_s_chosen_cell(tmp_path):
    """A suite file with ``tune`` (an installed task, made-up results): the tuned tables and the figures of each
    variant's chosen cell come back from the published folder alone."""
    suite_file = tmp_path / "tuned-pub.yaml"
    suite_file.write_text("name: tuned-pub\ntasks: [spurious]\nvariants: [softmax, quest]\nseeds: [0, 1, 2]\n"
                          "grid:\n  lr: [0.001, 0.01, 0.1]\ntune: [lr]\n")
    results, docs = tmp_path / "results", tmp_path / "docs"
    store = Store(results / "tuned-pub")
    for spec in load_suite(str(suite_file)).specs:
        store_run(store, spec)
    board = ["leaderboard", "--suite", str(suite_file), "--results", str(results), "--out", str(tmp_path / "a")]
    assert main(board) == 0
    assert main(["publish", "--suite", str(suite_file), "--results", str(results), "--out", str(docs)]) == 0
    shutil.rmtree(results)
    assert main(["leaderboard", "--from", str(docs / "tuned-pub"), "--out", str(tmp_path / "b")]) == 0
    ours, theirs = files(tmp_path / "b"), files(tmp_path / "a")
    assert sorted(ours) == sorted(theirs) and [n for n in ours if ours[n] != theirs[n] and n != "index.html"] == []
    assert "Equal tuning budget" in ours["README.md"].decode()
    assert json.loads((docs / "tuned-pub" / "manifest.json").read_text())["tune"] == ["lr"]
    curves = pq.read_table(docs / "tuned-pub" / "curves.parquet").to_pylist()
    max_logit = {(row["variant"], row["step"]): row["value"] for row in curves if row["key"] == "max_logit"}
    for variant in ("softmax", "quest"):  # the chosen cell (lr 0.001 validates best), not the mean of three rates
        assert max_logit[(variant, 40)] == 1.0 + 40 * 0.001


def test_an_edited_run_table_is_refused(published, tmp_path, capsys):
    copy = tmp_path / SUITE
    shutil.copytree(published["folder"], copy)
    table = pq.read_table(copy / "runs.parquet")
    pq.write_table(table.slice(1), copy / "runs.parquet")  # one run dropped by hand
    assert main(["leaderboard", "--from", str(copy), "--out", str(tmp_path / "out")]) == 2
    assert "runs.parquet was changed after publishing" in capsys.readouterr().err
    assert main(["leaderboard", "--from", str(tmp_path)]) == 2
    assert "has no manifest.json" in capsys.readouterr().err


def test_publish_replaces_only_a_folder_it_wrote(tmp_path, capsys):
    make_results(tmp_path / "results")
    taken = tmp_path / "docs" / SUITE
    taken.mkdir(parents=True)
    (taken / "notes.md").write_text("mine")
    args = ["publish", "--suite", SUITE, "--results", str(tmp_path / "results"), "--out", str(tmp_path / "docs")]
    assert main(args) == 2
    assert "holds no published suite" in capsys.readouterr().err
    assert (taken / "notes.md").read_text() == "mine"
    assert main(["publish", "--suite", "no-such-suite", "--results", str(tmp_path / "results")]) == 2
    assert "no results for suite 'no-such-suite'" in capsys.readouterr().err


def test_doc_blocks_must_equal_the_regenerated_tables(published, tmp_path):
    root = published["folder"].parent
    tables = sorted((published["folder"] / "leaderboard" / "tables").glob("*.csv"))
    name = tables[0].stem
    block = markdown_table(tables[0])
    assert block.startswith("| ") and block.count("\n") == len(tables[0].read_text().splitlines()) + 1
    doc = tmp_path / "guide" / "page.md"
    doc.parent.mkdir()
    doc.write_text(f"Intro.\n\n<!-- results:{SUITE}:{name} -->\nwritten by hand\n<!-- /results -->\n\nMore.\n")
    stale = [f"{doc}: block results:{SUITE}:{name}: differs from the table regenerated from {root / SUITE}; "
             f"`python -m quest_bench.publish fill {doc}` rewrites it"]
    assert doc_problems([doc], root) == stale
    assert publish_main(["fill", str(doc), "--results", str(root)]) == 0
    text = doc.read_text()
    assert text.startswith("Intro.\n\n") and text.endswith("<!-- /results -->\n\nMore.\n") and block in text
    link = os.path.relpath(published["folder"] / "leaderboard" / "README.md", doc.parent)
    assert f"[{SUITE}]({link})" in text and (doc.parent / link).is_file()
    assert doc_problems([doc], root) == [] and publish_main(["check", str(doc), "--results", str(root)]) == 0
    doc.write_text(text.replace(" | ", " |  ", 1))  # one cell edited by hand
    assert doc_problems([doc], root) == stale
    doc.write_text(f"<!-- results:{SUITE}:no-such-table -->\n<!-- /results -->\n"
                   f"<!-- results:other-suite:{name} -->\n<!-- /results -->\n")
    problems = doc_problems([doc], root)
    assert len(problems) == 2 and "no table 'no-such-table'" in problems[0] and "has no manifest.json" in problems[1]
    assert publish_main(["fill", str(doc), "--results", str(root)]) == 1  # nothing to fill them from


def test_a_doc_block_may_name_its_table_without_the_page_number(published, tmp_path):
    """``Provenance`` finds ``NN-Provenance`` wherever the page puts it; the block says which table it holds."""
    root = published["folder"].parent
    numbered = next((published["folder"] / "leaderboard" / "tables").glob("*-Provenance.csv"))
    doc = tmp_path / "page.md"
    doc.write_text(f"<!-- results:{SUITE}:Provenance -->\n<!-- /results -->\n"
                   f"<!-- results:{SUITE}:vance -->\n<!-- /results -->\n")
    assert publish_main(["fill", str(doc), "--results", str(root)]) == 1  # "vance" is no table's name
    text = doc.read_text()
    assert markdown_table(numbered) in text and f"(table {numbered.stem})" in text
    assert text.startswith(f"<!-- results:{SUITE}:Provenance -->\n")
    problems = doc_problems([doc], root)
    assert len(problems) == 1 and "no table 'vance'" in problems[0]


@pytest.mark.parametrize("cell, text", [("0.3046875", "0.3047"), ("0.041146169165", "0.04115"), ("10", "10"),
                                        ("-3", "-3"), ("1.8e-25", "1.8e-25"), ("nan", "nan"),
                                        ("+0.014 [-0.0156, +0.0435]", "+0.014 [-0.0156, +0.0435]"), ("quest", "quest")])
def test_a_doc_block_shows_decimal_numbers_to_four_digits_and_the_rest_as_written(cell, text):
    from quest_bench.publish import shown

    assert shown(cell) == text


def test_a_pairs_block_holds_the_pairs_tables_of_the_published_suite(published, tmp_path):
    from quest_bench.pairs import report
    from quest_bench.publish import read_table, result_of

    root = published["folder"].parent
    doc = tmp_path / "page.md"
    doc.write_text(f"<!-- results:{SUITE}:pairs/quest,softmax/lr/acc -->\n<!-- /results -->\n")
    assert len(doc_problems([doc], root)) == 1 and "differs from the table regenerated" in doc_problems([doc], root)[0]
    assert publish_main(["fill", str(doc), "--results", str(root)]) == 0
    runs = [result_of(row) for row in read_table(published["folder"] / "runs.parquet")]
    tables = report(runs, "quest", "softmax", "acc", "lr")  # the command's output, computed independently here
    text = doc.read_text()
    assert tables in text and "**toy (tiny)**" in text and "**toy-b (tiny)**" in text and "| 0.2 | 2 | 1 |" in text
    assert f"[{SUITE}](" in text and doc_problems([doc], root) == []
    doc.write_text(text.replace("| 0.2 | 2 | 1 |", "| 0.2 | 3 | 0 |", 1))  # a hand edit: the diverged pair hidden
    assert len(doc_problems([doc], root)) == 1
    doc.write_text(f"<!-- results:{SUITE}:pairs/quest/lr/acc -->\n<!-- /results -->\n"
                   f"<!-- results:{SUITE}:pairs/quest,qknorm/lr/acc -->\n<!-- /results -->\n")
    problems = doc_problems([doc], root)
    assert "a pairs block is named pairs/A,B/BY/METRIC" in problems[0] and "no runs of variant 'qknorm'" in problems[1]


def test_every_result_block_in_the_readme_and_docs_is_current():
    """The README and the docs' pages (not the published leaderboards): each marked block equals its table
    regenerated from docs/results/<suite>."""
    docs = REPO / "docs"
    pages = [REPO / "README.md", *sorted(p for p in docs.rglob("*.md") if p.relative_to(docs).parts[0] != "results")]
    assert doc_problems(pages, REPO / "docs" / "results") == []


@pytest.mark.parametrize("suite", sorted(p.parent.name for p in (REPO / "docs" / "results").glob("*/manifest.json")))
def test_each_published_leaderboard_is_what_its_folder_regenerates(suite, tmp_path):
    """A committed leaderboard (README.md and tables) equals its regeneration by the code as it is now: a change to
    the leaderboard shows here, and `quest-bench leaderboard --from docs/results/<suite>` brings it up to date."""
    folder = REPO / "docs" / "results" / suite
    assert main(["leaderboard", "--from", str(folder), "--out", str(tmp_path / "lb")]) == 0
    ours = {n: b for n, b in files(tmp_path / "lb").items() if not n.endswith(".png") and n != "index.html"}
    committed = {n: b for n, b in files(folder / "leaderboard").items() if not n.endswith(".png")}
    assert ours == committed


def lr_suites(tmp_path: Path, results: Path, tasks: dict[str, str]) -> dict[str, str]:
    """Suite files (name -> task; tuned on lr unless the name is "untuned") over lr {1e-3, 1e-2} × seeds 0-2, each
    with its runs stored under ``results``; returns the files by name."""
    files_of = {}
    for name, task in tasks.items():
        suite_file = tmp_path / f"{name}.yaml"
        suite_file.write_text(f"name: {name}\ntasks: [{task}]\nvariants: [softmax, quest]\nseeds: [0, 1, 2]\n"
                              f"grid:\n  lr: [0.001, 0.01]\n" + ("" if name == "untuned" else "tune: [lr]\n"))
        store = Store(results / name)
        for spec in load_suite(str(suite_file)).specs:
            store_run(store, spec)
        files_of[name] = str(suite_file)
    return files_of


def test_suites_that_tune_and_confirm_alike_publish_as_one_leaderboard(tmp_path, capsys):
    """Two tuned suites (one task each) published together: one folder, one leaderboard over both tasks, equal to
    the merged leaderboard of their results and regenerated from the folder alone; suites that tune differently,
    or no --name, are refused before anything is written."""
    results, docs = tmp_path / "results", tmp_path / "docs"
    files_of = lr_suites(tmp_path, results, {"one": "spurious", "two": "timeseries", "untuned": "timeseries"})
    merged = ["--suite", files_of["one"], "--suite", files_of["two"], "--results", str(results)]
    assert main(["leaderboard", *merged, "--out", str(tmp_path / "a")]) == 0
    assert main(["publish", *merged, "--out", str(docs)]) == 2
    assert "needs --name NAME" in capsys.readouterr().err
    assert main(["publish", "--suite", files_of["one"], "--suite", files_of["untuned"], "--results", str(results),
                 "--name", "both", "--out", str(docs)]) == 2
    assert "must tune and confirm alike" in capsys.readouterr().err and not docs.exists()
    assert main(["publish", *merged, "--name", "both", "--out", str(docs)]) == 0
    manifest = json.loads((docs / "both" / "manifest.json").read_text())
    assert manifest["suite"] == "both" and manifest["runs"] == 24 and manifest["tune"] == ["lr"]
    assert manifest["tasks"] == ["spurious (tiny)", "timeseries (tiny)"]
    assert main(["leaderboard", "--from", str(docs / "both"), "--out", str(tmp_path / "b")]) == 0
    ours, theirs = files(tmp_path / "b"), files(tmp_path / "a")
    assert sorted(ours) == sorted(theirs)
    assert [n for n in ours if ours[n] != theirs[n] and n not in ("index.html", "README.md")] == []
    title = lambda text: text.decode().split("\n", 1)  # noqa: E731  (the merged page's title names its suites)
    assert title(ours["README.md"])[1] == title(theirs["README.md"])[1]
    assert title(ours["README.md"])[0] == "# Leaderboard: both"


def test_a_published_suite_joins_a_new_publication_with_include(tmp_path, capsys):
    """`publish --include DIR`: a suite published earlier (its results folder since deleted) and a suite with
    results publish as one leaderboard, the same, figures included, as the two published from their results
    together; an included suite that tunes differently, or holds a task the suites given run, is refused."""
    results, docs = tmp_path / "results", tmp_path / "docs"
    files_of = lr_suites(tmp_path, results, {"one": "spurious", "two": "timeseries", "untuned": "image-cls"})
    for suite_file in files_of.values():
        assert main(["publish", "--suite", suite_file, "--results", str(results), "--out", str(docs)]) == 0
    assert main(["publish", "--suite", files_of["one"], "--suite", files_of["two"], "--results", str(results),
                 "--name", "both", "--out", str(tmp_path / "together")]) == 0
    shutil.rmtree(results / "one")
    given = ["publish", "--suite", files_of["two"], "--results", str(results), "--out", str(docs)]
    assert main([*given, "--include", str(docs / "one")]) == 2
    assert "needs --name NAME" in capsys.readouterr().err
    assert main([*given, "--include", str(docs / "untuned"), "--name", "both"]) == 2
    assert "tunes nothing" in capsys.readouterr().err and not (docs / "both").exists()
    assert main([*given, "--include", str(docs / "two"), "--name", "both"]) == 2
    assert "already holds timeseries (tiny)" in capsys.readouterr().err and not (docs / "both").exists()
    assert main([*given, "--include", str(docs / "one"), "--name", "both"]) == 0
    manifest = json.loads((docs / "both" / "manifest.json").read_text())
    assert manifest["runs"] == 24 and manifest["tasks"] == ["spurious (tiny)", "timeseries (tiny)"]
    ours, theirs = files(docs / "both" / "leaderboard"), files(tmp_path / "together" / "both" / "leaderboard")
    assert sorted(ours) == sorted(theirs) and any(n.endswith(".png") for n in ours)
    assert [n for n in ours if ours[n] != theirs[n] and n != "README.md"] == []
    drop_provenance = lambda text: text.decode().split("## Provenance")[0]  # noqa: E731  (dirty flags may differ)
    assert drop_provenance(ours["README.md"]) == drop_provenance(theirs["README.md"])


def test_the_provenance_gives_each_task_s_cost(published):
    """Per task: the sum of its runs' wall times (diverged and failed runs too) and its run count: each task has
    2 variants × 3 learning rates × seeds 0-2 with wall_s 10 + seed, 6 × (10 + 11 + 12) s = 0.055 run-hours."""
    text = next((published["folder"] / "leaderboard" / "tables").glob("*Provenance.json")).read_text()
    assert "compute by task (run-hours, runs)" in text
    assert "toy (tiny) 0.06 (18 runs); toy-b (tiny) 0.06 (18 runs)" in text
