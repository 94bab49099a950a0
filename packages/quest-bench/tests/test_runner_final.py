"""The runner adds the final_* telemetry metrics to every run's record; tasks report only their own metrics."""

from quest_bench.registry import get_task
from quest_bench.runner import execute, resolve
from quest_bench.spec import RunSpec
from quest_sdk.task import RunContext

FAST = {"steps": 12, "warmup_steps": 2, "eval_samples": 200, "log_every": 4}


def test_the_record_holds_the_last_telemetry_summary_as_final_metrics(tmp_path):
    result = execute(resolve(RunSpec("spurious", "quest", "tiny", 0, FAST)), tmp_path / "run", progress=False)
    assert result.status == "ok" and "max_logit" in result.telemetry
    finals = {k: v for k, v in result.metrics.items() if k.startswith("final_")}
    assert {f"final_{k}": v for k, v in result.telemetry.items()}.items() <= finals.items()
    assert {"final_biased_answer_key_norm", "final_other_key_norm"} <= finals.keys()  # the task's own final_ metrics

    task = get_task("spurious")
    ctx = RunContext(tmp_path / "direct", "quest", 0, progress=False)
    try:
        own = task.run(task.make_config("tiny", FAST), ctx).metrics
    finally:
        ctx.close()
    assert "final_max_logit" not in own and ctx.final_metrics()["final_max_logit"] == ctx.telemetry_last["max_logit"]
