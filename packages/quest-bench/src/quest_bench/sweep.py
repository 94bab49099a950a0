"""Run a suite on Ray: one Ray task per missing run, resources from the task preset, the driver the only writer.

With no address and no RAY_ADDRESS, a local Ray instance sized to this machine is started (and stopped after);
otherwise the sweep joins that cluster. Runs whose result.json already says ok/diverged are skipped, so an
interrupted sweep resumes by running it again. A worker that dies is retried up to ``max_retries`` times; a run
that diverges is a result, not an error.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from quest_bench.registry import get_task
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import FINISHED, Store
from quest_bench.suite import Suite

ARTIFACT_LIMIT = 20 * 2**20  # bytes of files a worker may send back per run


def run_in_worker(spec_json: dict, device: str, data_root: str | None) -> tuple[str, dict[str, bytes]]:
    """Executed in a Ray worker: run in a scratch folder, return the result and the run's files."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    from quest_bench.runner import execute

    spec = RunSpec.from_json(spec_json)
    scratch = Path(tempfile.mkdtemp(prefix=f"quest-{spec.run_id}-"))
    try:
        result = execute(spec, scratch, device=device, data_root=data_root, progress=False)
        return result.to_json(), collect_files(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def collect_files(folder: Path, limit: int = ARTIFACT_LIMIT) -> dict[str, bytes]:
    """A run's files to send back, up to ``limit`` bytes in all; a file that does not fit (a large checkpoint) is
    skipped, the smaller ones after it still come, and ``files_not_kept.txt`` lists what was skipped."""
    files, total, dropped = {}, 0, []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = path.stat().st_size
        if total + size > limit:
            dropped.append(f"{path.relative_to(folder)} ({size} bytes)")
            continue
        total += size
        files[str(path.relative_to(folder))] = path.read_bytes()
    if dropped:
        files["files_not_kept.txt"] = (f"over the per-run limit of files sent back ({limit} bytes):\n"
                                       + "\n".join(dropped) + "\n").encode()
    return files


def failed_result(spec: RunSpec, reason: str) -> RunResult:
    task = get_task(spec.task)
    return RunResult(run_id=spec.run_id, task=spec.task, task_version=task.version, variant=spec.variant,
                     preset=spec.preset, seed=spec.seed, overrides=dict(spec.overrides), status="failed",
                     reason=reason, primary_metric=task.primary_metric, higher_is_better=task.higher_is_better)


def run_sweep(suite: Suite, results_dir: Path, address: str | None = None, data_root: str | None = None,
              max_retries: int = 2, progress: bool = True) -> dict[str, int]:
    """Run every missing spec of ``suite``; returns counts by status for this invocation (plus 'skipped')."""
    import ray

    store = Store(Path(results_dir) / suite.name)
    done = store.sync()
    todo = [s for s in suite.specs if s.run_id not in done]
    counts = {"skipped": len(suite.specs) - len(todo), "ok": 0, "diverged": 0, "failed": 0}
    print(f"suite {suite.name}: {len(suite.specs)} runs, {counts['skipped']} already finished, {len(todo)} to run"
          f" -> {store.root}", file=sys.stderr)
    if not todo:
        return counts

    address = address or os.environ.get("RAY_ADDRESS")
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # loopback-only, no dashboard: no token auth (else Ray writes ~/.ray/auth_token; see stack.md)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"TQDM_DISABLE": "1"}})
    remote = ray.remote(run_in_worker)
    pending = {}
    for spec in todo:
        res = get_task(spec.task).resources_for(spec.preset)
        device = "cuda" if res.num_gpus > 0 else "cpu"
        ref = remote.options(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_retries=max_retries,
                             name=spec.label()).remote(spec.to_json(), device, data_root)
        pending[ref] = spec
    slots = max(1, int(ray.cluster_resources().get("CPU", 1)))  # upper bound on runs in flight (for display)
    bar = tqdm(total=len(todo), desc=f"sweep {suite.name}", disable=not progress, dynamic_ncols=True)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=5.0)
            for ref in ready:
                spec = pending.pop(ref)
                try:
                    result_json, files = ray.get(ref)
                    result = RunResult.from_dict(json.loads(result_json))
                except ray.exceptions.RayError as err:  # the worker died on every attempt
                    result, files = failed_result(spec, f"worker died ({max_retries} retries): {type(err).__name__}"), {}
                write_run(store, spec, result, files)
                counts[result.status] += 1
                bar.set_postfix(running=min(len(pending), slots), ok=counts["ok"], diverged=counts["diverged"],
                                failed=counts["failed"], refresh=False)
                bar.update(1)
    finally:
        bar.close()
        if started_here:
            ray.shutdown()
    return counts


def write_run(store: Store, spec: RunSpec, result: RunResult, files: dict[str, bytes]) -> None:
    folder = store.run_dir(spec.run_id)
    shutil.rmtree(folder, ignore_errors=True)  # a re-run replaces every file of the earlier attempt (error.txt, ...)
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    store.write(spec, result)
    if result.status not in FINISHED:
        print(f"run {spec.label()} {result.status}: {result.reason}", file=sys.stderr)
