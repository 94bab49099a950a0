"""One run on N data-parallel workers through Ray Train (``TorchTrainer``: DDP, gloo on CPU, NCCL on GPU).

Every worker runs the same spec through ``quest_bench.runner.execute``; the shared engine (``quest_sdk.engine``)
wraps the model in DDP and gives each worker its share of every global batch, so N workers train with the same
global batch as one. Worker 0 writes the run folder (events.jsonl, TensorBoard, figures) and reports the result.
Checkpoints go through Ray Train's checkpoint API into ``<run folder>/ray-train``; when a worker dies, Ray Train
restarts the group (``FailureConfig(max_failures)``) and every worker resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from pathlib import Path

import torch

from quest_bench.result import RunResult
from quest_bench.spec import RunSpec

CHECKPOINT_FILE = "checkpoint.pt"
WORKER_RESULT = "worker-result.json"  # worker 0's result, handed to the caller (which writes result.json)


class RayTrainCheckpoints:
    """The checkpoint store of a Ray Train worker: ``save`` reports a checkpoint (written by worker 0; every worker
    calls ``ray.train.report``, which Ray Train requires), ``load`` reads the latest one Ray Train restored. An
    unreadable or unfitting checkpoint is set aside once with the reason in ``<folder>/checkpoint.unusable.txt``
    (``quest_sdk.checkpoint.record_set_aside``, the rule of every store); a second one raises
    ``UnusableCheckpoint``. ``folder`` is the run folder on worker 0, None on the others (they only warn)."""

    def __init__(self, rank: int, folder: Path | None = None):
        self.rank, self.folder = rank, (Path(folder) if folder is not None else None)
        self.restored: Path | None = None  # the file ``load`` last read

    def save(self, state: dict, step: int) -> None:
        import ray.train

        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if self.rank == 0:
                torch.save(state, Path(folder) / CHECKPOINT_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"step": step}, checkpoint=checkpoint)

    def load(self) -> dict | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            return self.read(Path(folder) / CHECKPOINT_FILE)

    def read(self, path: Path) -> dict | None:
        """The state in ``path``; None after setting an unreadable one aside."""
        self.restored = Path(path)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or foreign file: starting over loses time, not results
            self.set_aside(f"{type(err).__name__}: {err}", kind="unreadable")
            return None

    def set_aside(self, reason: str, kind: str = "unusable") -> None:
        """Record the restored checkpoint as unusable in the run folder (Ray Train owns the file, so it stays);
        raise ``UnusableCheckpoint`` if one was recorded before."""
        from quest_sdk.checkpoint import record_set_aside

        record_set_aside(self.folder if self.rank == 0 else None, self.restored or Path(CHECKPOINT_FILE), reason,
                         kind, move=self.rank == 0)


def worker_loop(config: dict) -> None:
    """Ray Train's per-worker function: run the spec as worker ``rank`` of the group; worker 0 leaves the result
    in the run folder for ``execute_distributed``."""
    import ray.train

    from quest_bench.runner import execute

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    spec = RunSpec.from_json(config["spec"])
    with tempfile.TemporaryDirectory() as scratch:  # workers other than 0 write nothing that is kept
        out_dir = Path(config["out_dir"]) if rank == 0 else Path(scratch)
        result = execute(spec, out_dir, device=config["device"], data_root=config["data_root"],
                         progress=config["progress"] and rank == 0, checkpoint_every=config["checkpoint_every"],
                         rank=rank, world_size=world, checkpoints=RayTrainCheckpoints(rank, out_dir if rank == 0 else None),
                         threads=config.get("threads"))
    if rank == 0:
        (out_dir / WORKER_RESULT).write_text(result.to_json())


def execute_distributed(spec: RunSpec, out_dir: Path, workers: int, device: str = "cpu",
                        data_root: str | None = None, progress: bool = True, checkpoint_every: int = 0,
                        max_failures: int = 2, cpus_per_worker: float = 1, threads: int | None = None,
                        memory_per_worker: int = 0) -> RunResult:
    """Run ``spec`` on ``workers`` Ray Train workers (Ray must be initialised), each with ``cpus_per_worker`` CPUs,
    a GPU on CUDA and ``memory_per_worker`` bytes of Ray's memory resource (0: none reserved); the result of
    worker 0."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from quest_bench.registry import get_task

    get_task(spec.task).check_workers(workers)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"spec": spec.to_json(), "out_dir": str(out_dir), "device": device, "data_root": data_root,
                           "progress": progress, "checkpoint_every": checkpoint_every, "threads": threads},
        torch_config=TorchConfig(backend="nccl" if device == "cuda" else "gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=device == "cuda",
                                     resources_per_worker={"CPU": cpus_per_worker,
                                                           **({"memory": memory_per_worker} if memory_per_worker else {}),
                                                           **({"GPU": 1} if device == "cuda" else {})}),
        run_config=RunConfig(name="ray-train", storage_path=str(out_dir),
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             worker_runtime_env={"env_vars": _worker_env()}),
    )
    (out_dir / WORKER_RESULT).unlink(missing_ok=True)
    try:
        outcome = trainer.fit()
        if outcome.error is not None:
            raise outcome.error
    except Exception as err:  # workers died more often than max_failures allows, or Ray Train itself failed
        from quest_bench.sweep import failed_result

        (out_dir / "error.txt").write_text(traceback.format_exc())
        return failed_result(spec, f"Ray Train: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    handed = out_dir / WORKER_RESULT
    result = RunResult.from_dict(json.loads(handed.read_text()))
    handed.unlink()
    return result


def _worker_env() -> dict[str, str]:
    """The fault-injection variables of the tests reach the Ray Train workers too, and so does the project folder
    (``quest_bench.paths``: each worker records its git sha)."""
    from quest_bench.paths import ROOT_ENV, project_root

    return {**{k: os.environ[k] for k in ("QUEST_BENCH_FAULTS", "QUEST_BENCH_TRACKING", "TQDM_DISABLE")
               if k in os.environ}, ROOT_ENV: str(project_root())}
