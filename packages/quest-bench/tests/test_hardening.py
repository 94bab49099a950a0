"""Fault injection, in-process: bad configs, bad names, unusable results, broken or read-only indexes, the lock,
infeasible resources, and the command line's one-line errors (rc 2) that write nothing."""

import dataclasses
import errno
import json
import os
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import quest_bench.runner as runner
from quest_bench.cli import main
from quest_sdk.config import valid_values
from quest_bench.registry import get_task, task_names
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec, check_name, slug
from quest_bench.store import Store, StoreLock
from quest_bench.sweep import Placement, check_feasible, placement, run_sweep
from quest_sdk.task import Resources, Task, TaskOutput

FAST = ["--set", "steps=30", "--set", "warmup_steps=5", "--set", "eval_samples=200", "--quiet"]


def outside(valid):
    """A value just outside a declared range (None if the range has no bound)."""
    if valid.choices is not None:
        return "no-such-choice"
    if valid.items is not None:
        bound = valid.ge if valid.ge is not None else valid.gt
        return None if bound is None else f"{bound - 1:g}"
    for bound, step in ((valid.ge, -1), (valid.gt, 0), (valid.le, 1), (valid.lt, 0)):
        if bound is not None:
            return bound + step
    return None


@pytest.mark.parametrize("name", task_names())
def test_every_task_declares_ranges_and_rejects_values_outside_them(name):
    task = get_task(name)
    for preset in task.presets:
        task.make_config(preset, {})  # every preset is valid
    ranges = {f.name: valid_values(task.config_class, f.name) for f in dataclasses.fields(task.config_class)}
    fields = [f for f in dataclasses.fields(task.config_class) if ranges[f.name] is not None]
    numeric = [f for f in dataclasses.fields(task.config_class) if f.type in ("int", "float", int, float)]
    assert len(fields) >= len(numeric), f"{name}: some numeric fields declare no range"
    for f in fields:
        bad = outside(ranges[f.name])
        if bad is None:
            continue
        with pytest.raises(ValueError, match=rf"config key '{f.name}' = .* is out of range; valid: "):
            task.make_config("tiny", {f.name: bad})


def test_range_errors_name_the_key_the_value_and_the_range():
    task = get_task("spurious")
    with pytest.raises(ValueError, match=r"'steps' = -5 is out of range; valid: >= 1$"):
        task.make_config("tiny", {"steps": -5})
    with pytest.raises(ValueError, match=r"'p_biased' = 1.5 is out of range; valid: >= 0 and <= 1$"):
        task.make_config("tiny", {"p_biased": 1.5})
    with pytest.raises(ValueError, match=r"'lr' = nan is out of range"):
        task.make_config("tiny", {"lr": "nan"})
    with pytest.raises(ValueError, match=r"signal_dims \(9\) must be <= key_dim \(8\)"):
        task.make_config("tiny", {"signal_dims": 9})
    with pytest.raises(ValueError, match=r"no config key 'stpes'.*Did you mean 'steps'\?"):
        task.make_config("tiny", {"stpes": 3})
    with pytest.raises(ValueError, match=r"'severities' = '1,7' is out of range; valid: a comma-separated list"):
        get_task("det3d").make_config("tiny", {"severities": "1,7"})


def test_warmup_steps_zero_trains(tmp_path):
    assert main(["run", "spurious", "--set", "warmup_steps=0", "--out", str(tmp_path / "run"), *FAST]) == 0
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "ok"


# --- a run without a usable primary metric is failed -----------------------------------------------------------

@dataclasses.dataclass
class FakeConfig:
    value: float = 1.0


class FakeTask(Task):
    name, version, primary_metric = "fake", "1", "score"
    config_class = FakeConfig
    presets = {"tiny": {}}

    def __init__(self, metrics):
        self.metrics = metrics

    def run(self, config, ctx):
        return TaskOutput(dict(self.metrics))


@pytest.mark.parametrize("metrics, reason", [({"score": float("nan")}, "primary metric 'score' is nan"),
                                             ({"other": 1.0}, "primary metric 'score' is None")])
def test_missing_or_non_finite_primary_metric_is_failed(metrics, reason, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "get_task", lambda name: FakeTask(metrics))
    result = runner.execute(RunSpec("fake", "quest"), tmp_path)
    assert (result.status, result.reason) == ("failed", reason)


# --- the store: unusable results, stale / corrupt / read-only index ------------------------------------------

def result_for(spec, status="ok", value=0.5):
    return RunResult(run_id=spec.run_id, task=spec.task, task_version="1", variant=spec.variant, preset="tiny",
                     seed=spec.seed, overrides={}, status=status, primary_metric="robust_success",
                     metrics={} if value is None else {"robust_success": value})


def filled_store(tmp_path, values=(0.5, None, float("nan"))):
    store = Store(tmp_path / "suite")
    specs = [RunSpec("spurious", v, "tiny", s, {}, "x") for v in ("softmax", "quest") for s in range(len(values))]
    for spec in specs:
        store.write(spec, result_for(spec, value=values[spec.seed]))
    return store, specs


def test_ok_without_a_finite_primary_is_not_finished_and_the_leaderboard_warns_once_per_run(tmp_path, capsys):
    from quest_bench.leaderboard import write_leaderboard

    store, specs = filled_store(tmp_path)
    assert store.finished_ids() == {s.run_id for s in specs if s.seed == 0}  # the others run again
    md = (write_leaderboard(store, "suite") / "README.md").read_text()
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: run ")]
    assert len(warnings) == 4 and all("the next sweep runs it again" in w for w in warnings)
    assert "| softmax | 1 | 0.500" in md and "| quest | 1 | 0.500" in md
    assert "+0.000" in md  # the delta is computed from the usable pair, not blanked by the NaN


def test_an_edited_result_json_is_seen_through_the_index(tmp_path):
    store, specs = filled_store(tmp_path, values=(0.5,))
    assert sorted(r.metrics["robust_success"] for r in store.load()) == [0.5, 0.5]
    path = store.run_dir(specs[0].run_id) / "result.json"
    data = json.loads(path.read_text())
    data["metrics"]["robust_success"] = 0.9
    time.sleep(0.01)
    path.write_text(json.dumps(data))
    os.utime(path, (time.time() + 5, time.time() + 5))  # newer than the index, even on coarse clocks
    assert sorted(r.metrics["robust_success"] for r in store.load()) == [0.5, 0.9]


def test_a_corrupt_index_is_rebuilt(tmp_path):
    store, _ = filled_store(tmp_path, values=(0.5,))
    store.db_path.write_bytes(b"this is not an sqlite database" * 100)
    assert len(store.load()) == 2
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone() == (2,)


def make_read_only(monkeypatch, root: Path):
    """Writes under ``root`` fail as on a read-only mount (tests run as root, where chmod does not stop writes)."""
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(root))

    real_connect, real_open = sqlite3.connect, os.open
    monkeypatch.setattr("quest_bench.store.sqlite3.connect",
                        lambda p, *a, **k: refuse() if str(p).startswith(str(root)) else real_connect(p, *a, **k))
    monkeypatch.setattr("quest_bench.store.os.open",
                        lambda p, *a, **k: refuse() if str(p).startswith(str(root)) else real_open(p, *a, **k))
    for name in ("unlink", "mkdir", "write_text", "write_bytes"):
        real = getattr(Path, name)
        monkeypatch.setattr(Path, name, lambda self, *a, _real=real, **k:
                            refuse() if str(self).startswith(str(root)) else _real(self, *a, **k))


def test_a_read_only_results_folder_is_read_without_writing(tmp_path, monkeypatch, capsys):
    from quest_bench.leaderboard import write_leaderboard

    store, specs = filled_store(tmp_path, values=(0.5,))
    store.db_path.unlink()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    make_read_only(monkeypatch, store.root)
    assert len(store.load()) == 2  # no index can be written: read from the folders
    out = tmp_path.parent / f"{tmp_path.name}-board"
    folder = write_leaderboard(store, "suite", None, out)
    assert (folder / "README.md").exists()
    suite = type("S", (), {"name": "suite", "specs": specs, "confirm": []})()
    assert run_sweep(suite, tmp_path) == {"skipped": 2, "ok": 0, "diverged": 0, "failed": 0}
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


# --- one driver per results folder ---------------------------------------------------------------------------

def test_a_second_driver_refuses_or_waits(tmp_path):
    path = tmp_path / ".lock"
    with StoreLock(path):
        with pytest.raises(ValueError, match=r"in use by another sweep driver \(pid \d+ on .*\); .*--wait"):
            with StoreLock(path):
                pass
        order = []

        def second():
            with StoreLock(path, wait=True):
                order.append("second")

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        order.append("first released")
    thread.join(timeout=300)  # a bound against a hang only
    assert order == ["first released", "second"]


# --- resources, names -------------------------------------------------------------------------------------------

def test_infeasible_resources_are_refused_with_what_the_cluster_has(monkeypatch):
    class GpuTask(FakeTask):
        resources = {"tiny": Resources(num_cpus=4, num_gpus=1)}

    monkeypatch.setattr("quest_bench.sweep.get_task", lambda name: GpuTask({}))
    spec = RunSpec("fake", "quest")
    places = {spec.run_id: placement(spec)}
    assert places[spec.run_id] == Placement("cuda", 1, 4, 1.0)
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 1.0}}]
    with pytest.raises(ValueError, match=r"needs 1 worker\(s\) of 4 CPUs, 1 GPUs \(cuda\), but the cluster's nodes "
                                         r"have: 2 CPUs, 0 GPUs\..*--wait-for-resources"):
        check_feasible([spec], places, nodes)
    check_feasible([spec], places, [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}])
    # data-parallel workers may spread over nodes, but must all fit
    four = {spec.run_id: placement(spec, workers=4)}
    two_nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}] * 2
    check_feasible([spec], four, two_nodes)
    with pytest.raises(ValueError, match="needs 5 worker"):
        check_feasible([spec], {spec.run_id: placement(spec, workers=5)}, two_nodes)
    # --device cpu runs the GPU preset on CPUs
    assert placement(spec, device="cpu") == Placement("cpu", 1, 4, 0.0)
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        placement(spec, workers=-1)


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "x y", "", "a..b", "tiny\n"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(ValueError, match="use letters, digits"):
        check_name("suite", name)


def test_slugs_and_links():
    from quest_bench.leaderboard import LINK, safe_link

    assert slug("../../etc/passwd") == "etc_passwd"
    assert slug("lm-tiny") == "lm-tiny"
    md = "[ok](../runs/abc/curves.png) [bad](javascript:alert(1)) [abs](/etc/passwd) [web](https://x.org)"
    html_text = LINK.sub(safe_link, md)
    assert '<a href="../runs/abc/curves.png">ok</a>' in html_text
    assert html_text.count("<a ") == 1


# --- the command line: one line, rc 2, nothing written ------------------------------------------------------------

def bad_suite(tmp_path, text, name="bad"):
    path = tmp_path / "suites" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


CLI_CASES = {
    "negative steps": (["run", "spurious", "--set", "steps=-5"], r"'steps' = -5 is out of range; valid: >= 1"),
    "zero eval_samples": (["run", "spurious", "--set", "eval_samples=0"], r"'eval_samples' = 0 is out of range"),
    "malformed yaml": (["sweep", "--suite", "{suites}/yaml.yaml"], r"not valid YAML \(line \d+, column \d+\): expected"),
    "yaml not a mapping": (["sweep", "--suite", "{suites}/list.yaml"], r"a suite is a YAML mapping"),
    "suite escaping": (["sweep", "--suite", "{suites}/escape.yaml"], r"invalid suite name '../../x'"),
    "bad variant in suite": (["sweep", "--suite", "{suites}/variant.yaml"], r"unknown attention variant|unknown variant"),
    "negative retries": (["sweep", "--suite", "smoke", "--max-retries", "-1"], r"--max-retries must be .*>= 0"),
    "zero timeout": (["sweep", "--suite", "smoke", "--run-timeout", "0"], r"--run-timeout must be .* > 0"),
    "results is a file": (["sweep", "--suite", "smoke", "--results", "{file}"], r"--results .* is a file"),
    "out is a file": (["run", "spurious", "--out", "{file}"], r"--out .* is a file"),
    "board results is a file": (["leaderboard", "--suite", "smoke", "--results", "{file}"], r"is a file"),
    "cuda without cuda": (["run", "spurious", "--device", "cuda"], r"no CUDA device is available here"),
    "set not yaml": (["run", "spurious", "--set", "lr=["], r"config key 'lr' expects float, got '\['"),
    "spec not an object": (["run", "--spec", "{file}"], r"is not a run's spec.json"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_user_errors_are_one_line_rc_2_and_write_nothing(case, tmp_path, capsys, monkeypatch):
    import torch

    argv, message = CLI_CASES[case]
    if case == "cuda without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "yaml.yaml").write_text("name: yaml\ntasks: [spurious\nvariants: [quest]\n")
    (suites / "list.yaml").write_text("- spurious\n- quest\n")
    (suites / "escape.yaml").write_text("name: ../../x\ntasks: [spurious]\nvariants: [quest]\n")
    (suites / "variant.yaml").write_text("name: v\ntasks: [spurious]\nvariants: [qeust]\n")
    (tmp_path / "a-file").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = [a.format(suites=suites, file=tmp_path / "a-file") for a in argv]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert re.search(message, err), err
    assert err.startswith("quest-bench: error: ") and len(err.splitlines()) == 1
    assert list(work.iterdir()) == []
    assert (tmp_path / "a-file").read_text() == "x"


def test_run_out_refuses_a_folder_holding_something_else(tmp_path, capsys):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    assert main(["run", "spurious", "--out", str(other), *FAST]) == 2
    assert "holds no run" in capsys.readouterr().err
    assert main(["run", "spurious", "--out", str(other), "--force", *FAST]) == 2  # --force never deletes non-runs
    assert [p.name for p in other.iterdir()] == ["mine.txt"]


def test_run_out_same_spec_is_a_no_op_different_spec_needs_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "spurious", "--out", str(out), *FAST]) == 0
    first = (out / "result.json").read_text()
    assert main(["run", "spurious", "--out", str(out), *FAST]) == 0
    assert "already holds this finished run" in capsys.readouterr().err
    assert (out / "result.json").read_text() == first
    assert main(["run", "spurious", "--out", str(out), "--seed", "1", *FAST]) == 2
    assert "holds a different run" in capsys.readouterr().err
    assert main(["run", "spurious", "--out", str(out), "--seed", "1", "--force", *FAST]) == 0
    assert json.loads((out / "result.json").read_text())["seed"] == 1


def test_run_out_with_an_unfinished_run_of_the_same_spec_runs_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "spurious", "--out", str(out), *FAST]) == 0
    (out / "result.json").unlink()  # interrupted before the result was written
    assert main(["run", "spurious", "--out", str(out), *FAST]) == 0
    assert "resuming" in capsys.readouterr().err and (out / "result.json").exists()


def test_disk_full_and_ctrl_c_end_in_one_line(tmp_path, capsys, monkeypatch):
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "spec.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["run", "spurious", "--out", str(tmp_path / "a"), *FAST]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("quest-bench: error: No space left on device: ") and len(err) == 2  # after "running"
    monkeypatch.setattr(Path, "write_text", real)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute", interrupted)
    assert main(["run", "spurious", "--out", str(tmp_path / "b"), *FAST]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err

    def killed(*a, **k):  # `kill PID`: what stops a background job, whose SIGINT the shell ignores
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(runner, "execute", killed)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["run", "spurious", "--out", str(tmp_path / "c"), *FAST]) == 143
    assert signal.getsignal(signal.SIGTERM) is before  # restored when main returns
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err



def test_a_sweep_refuses_to_start_while_another_driver_holds_its_folder(tmp_path):
    store = Store(tmp_path / "suite")
    suite = type("S", (), {"name": "suite", "specs": [RunSpec("spurious", "quest", "tiny", 0, {}, "x")], "confirm": []})()
    with StoreLock(store.lock_path):
        with pytest.raises(ValueError, match="in use by another sweep driver"):
            run_sweep(suite, tmp_path)  # refused before Ray starts or anything runs
    assert not store.runs_dir.exists()


def test_a_suite_with_variants_all_runs_every_registered_variant(tmp_path):
    import quest_core

    from quest_bench.suite import load_suite

    path = tmp_path / "every.yaml"
    path.write_text("name: every\ntasks: [spurious]\nvariants: all\nseeds: [0, 1]\n")
    specs = load_suite(str(path)).specs
    assert sorted({s.variant for s in specs}) == sorted(quest_core.list_variants()) and len(specs) == 2 * len(
        quest_core.list_variants())
