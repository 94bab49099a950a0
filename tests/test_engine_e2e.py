"""End-to-end checks of the shared training engine through the CLI: a run killed mid-training resumes to the same
numbers; two Ray Train workers equal one worker; a killed Ray Train worker resumes from the last checkpoint; a
sweep's retried run resumes from the checkpoint its dead worker left in the results folder."""

import json
import tempfile
from pathlib import Path

import pytest

from helpers import cli_env, quest_bench

pytestmark = pytest.mark.slow

RUNS = {  # a few steps of each task, small evaluations
    "lm": ["--set", "steps=12", "--set", "warmup_steps=2", "--set", "eval_tokens=2000", "--set", "log_every=4",
           "--set", "dropout=0"],
    "image-cls": ["--set", "epochs=1", "--set", "batch_size=256", "--set", "eval_samples=200",
                  "--set", "adv_samples=16", "--set", "corruption_samples=40", "--set", "pgd_steps=2",
                  "--set", "figure_images=1", "--set", "log_every=4"],
}


def run(task: str, out: Path, *extra, faults: str | None = None, timeout: int = 600):
    env = cli_env(**({"QUEST_BENCH_FAULTS": faults} if faults else {}))
    return quest_bench("run", task, "--attention", "quest", "--preset", "tiny", "--threads", "1", "--quiet",
                       "--out", out, *RUNS[task], *extra, env=env, timeout=timeout)


def result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("task", sorted(RUNS))
def test_a_run_killed_mid_training_resumes_to_the_same_numbers(task, tmp_path):
    straight = run(task, tmp_path / "straight", "--checkpoint-every", "4")
    assert straight.returncode == 0, straight.stderr[-3000:]
    marker = tmp_path / "crashed"
    killed = run(task, tmp_path / "resumed", "--checkpoint-every", "4", faults=f"crash_at_step=6,crash_once={marker}")
    assert killed.returncode == 17 and marker.exists(), killed.stderr[-3000:]  # the process died at step 6
    assert not (tmp_path / "resumed" / "result.json").exists()
    assert (tmp_path / "resumed" / "checkpoint.pt").exists()
    again = run(task, tmp_path / "resumed", "--checkpoint-every", "4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stderr
    assert result(tmp_path / "resumed")["resumed_from_step"] == 4
    assert result(tmp_path / "straight")["resumed_from_step"] == 0
    assert result(tmp_path / "resumed")["metrics"] == result(tmp_path / "straight")["metrics"]  # bitwise
    events = [json.loads(line) for line in (tmp_path / "resumed" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == sorted({e["step"] for e in events})  # no step logged twice


def test_two_ray_train_workers_equal_one_worker_and_a_killed_worker_resumes(tmp_path):
    one = run("lm", tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = run("lm", tmp_path / "two", "--workers", "2", timeout=900)
    assert two.returncode == 0, two.stderr[-3000:]
    m1, m2 = result(tmp_path / "one")["metrics"], result(tmp_path / "two")["metrics"]
    assert result(tmp_path / "two")["env"]["workers"] == 2
    for key in ("valid_ppl", "test_ppl"):  # the same global batch: equal up to float summation order
        assert m2[key] == pytest.approx(m1[key], rel=1e-3), key
    assert any((tmp_path / "two" / "tensorboard").glob("events.out.tfevents.*"))

    marker = Path(tempfile.mkdtemp()) / "crashed"
    killed = run("lm", tmp_path / "killed", "--workers", "2", "--checkpoint-every", "4",
                 faults=f"crash_at_step=6,crash_once={marker}", timeout=900)
    assert killed.returncode == 0, killed.stderr[-3000:]  # Ray Train restarted the group
    assert marker.exists()
    assert result(tmp_path / "killed")["resumed_from_step"] == 4
    for key in ("valid_ppl", "test_ppl"):
        assert result(tmp_path / "killed")["metrics"][key] == pytest.approx(m2[key], rel=1e-3), key


def test_a_sweep_retry_resumes_from_the_checkpoint_its_dead_worker_left(tmp_path):
    suite = tmp_path / "resume.yaml"
    suite.write_text("name: resume\ntasks: [lm]\nvariants: [quest]\npresets: [tiny]\nseeds: [0]\n"
                     "overrides: {steps: 12, warmup_steps: 2, eval_tokens: 2000, log_every: 4}\n")
    marker = tmp_path / "crashed"
    proc = quest_bench("sweep", "--suite", suite, "--results", tmp_path / "results", "--checkpoint-every", "4",
                       env=cli_env(QUEST_BENCH_FAULTS=f"crash_at_step=6,crash_once={marker}"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    (folder,) = (tmp_path / "results" / "resume" / "runs").iterdir()
    assert result(folder)["status"] == "ok"
    assert result(folder)["resumed_from_step"] == 4
    assert (folder / "checkpoint.pt").exists() and (folder / "events.jsonl").exists()


def test_runs_on_a_storage_uri_mirror_their_folder_and_resume_from_it(tmp_path):
    suite = tmp_path / "mirror.yaml"
    suite.write_text("name: mirror\ntasks: [lm]\nvariants: [quest]\npresets: [tiny]\nseeds: [0]\n"
                     "overrides: {steps: 12, warmup_steps: 2, eval_tokens: 2000, log_every: 4}\n")
    marker, storage = tmp_path / "crashed", tmp_path / "bucket"
    proc = quest_bench("sweep", "--suite", suite, "--results", tmp_path / "results", "--checkpoint-every", "4",
                       "--storage", storage.as_uri(),
                       env=cli_env(QUEST_BENCH_FAULTS=f"crash_at_step=6,crash_once={marker}"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    (folder,) = (tmp_path / "results" / "mirror" / "runs").iterdir()
    assert result(folder)["status"] == "ok"
    assert result(folder)["resumed_from_step"] == 4  # the retry pulled the checkpoint its dead worker had pushed
    mirrored = storage / "mirror" / "runs" / folder.name
    assert {"events.jsonl", "checkpoint.pt", "tensorboard"} <= {p.name for p in mirrored.iterdir()}
    assert (folder / "events.jsonl").read_text() == (mirrored / "events.jsonl").read_text()
    bad = quest_bench("sweep", "--suite", suite, "--results", tmp_path / "other", "--storage", "nope://x")
    assert bad.returncode == 2 and "--storage nope://x: pyarrow cannot open it" in bad.stderr


def test_a_ray_train_run_whose_workers_die_too_often_is_a_failed_result(tmp_path):
    marker = tmp_path / "crashed"
    proc = run("lm", tmp_path / "run", "--workers", "2", "--max-failures", "0", "--checkpoint-every", "4",
               faults=f"crash_at_step=6,crash_once={marker}", timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    outcome = result(tmp_path / "run")
    assert outcome["status"] == "failed" and outcome["reason"].startswith("Ray Train: ")
    assert "Traceback" in (tmp_path / "run" / "error.txt").read_text()
