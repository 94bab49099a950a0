"""Data-parallel runs through the CLI on 2 Ray Train CPU workers (gloo): a divergence that one worker alone sees is
recorded ``diverged`` at the step it happened (every worker stopped there), not ``failed``."""

import json

import pytest

from helpers import cli_env, quest_bench

pytestmark = pytest.mark.slow

LM = ["--set", "steps=12", "--set", "warmup_steps=2", "--set", "eval_tokens=2000", "--set", "log_every=4",
      "--set", "dropout=0"]


def test_a_divergence_on_one_worker_is_a_diverged_result(tmp_path):
    out = tmp_path / "run"
    proc = quest_bench("run", "lm", "--attention", "quest", "--preset", "tiny", "--threads", "1", "--quiet",
                       "--workers", "2", "--max-failures", "0", "--out", out, *LM,
                       env=cli_env(QUEST_BENCH_FAULTS="diverge_at_step=5,diverge_rank=1"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert (result["status"], result["diverged_step"]) == ("diverged", 5), result.get("reason")
    assert result["reason"] == "loss is nan on worker 1 of 2"
    assert result["env"]["workers"] == 2
    assert not (out / "error.txt").exists()
