"""Experiment tracking through existing libraries: TensorBoard event files for every run (``<run>/tensorboard``),
and MLflow when ``QUEST_BENCH_TRACKING=mlflow`` (off by default). MLflow's own variables say where: a tracking
server (``MLFLOW_TRACKING_URI=http://...``), or with no network a local store
(``MLFLOW_TRACKING_URI=file:///path/mlruns`` plus ``MLFLOW_ALLOW_FILE_STORE=true``, which MLflow 3 requires for
file stores). ``pip install mlflow-skinny`` (the ``quest-sdk[mlflow]`` extra) provides the client."""

from __future__ import annotations

import math
import os
from pathlib import Path

TRACKING_ENV = "QUEST_BENCH_TRACKING"
TRACKERS = ("tensorboard", "mlflow")


def enabled_trackers() -> list[str]:
    """TensorBoard always; the trackers named (comma-separated) in ``QUEST_BENCH_TRACKING`` on top."""
    named = [t.strip() for t in os.environ.get(TRACKING_ENV, "").split(",") if t.strip()]
    unknown = sorted(set(named) - set(TRACKERS))
    if unknown:
        raise ValueError(f"{TRACKING_ENV}={os.environ[TRACKING_ENV]!r}: unknown tracker(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(TRACKERS)}")
    return ["tensorboard", *(t for t in named if t != "tensorboard")]


class Tracker:
    """Scalars of a run's training curves and final metrics, to every enabled tracker."""

    def __init__(self, out_dir: Path, run_name: str, params: dict | None = None, purge_step: int | None = None):
        """``purge_step``: a resumed run drops the TensorBoard points an interrupted attempt logged from there on."""
        self.writers = []
        for name in enabled_trackers():
            self.writers.append(_TensorBoard(out_dir, purge_step) if name == "tensorboard"
                                else _MLflow(run_name, params or {}))

    def log(self, step: int, values: dict[str, float]) -> None:
        for writer in self.writers:
            writer.log(step, values)

    def final(self, hparams: dict, metrics: dict[str, float]) -> None:
        """A finished run's settings and final metrics (TensorBoard's HParams table; MLflow params and metrics)."""
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        metrics = {f"final/{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for writer in self.writers:
            writer.final(hparams, metrics)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class _TensorBoard:
    def __init__(self, out_dir: Path, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=purge_step)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def final(self, hparams: dict, metrics: dict[str, float]) -> None:
        self.writer.add_hparams(hparams, metrics, run_name=".")  # "." : in this run's own folder, not a new one

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, run_name: str, params: dict):
        try:
            import mlflow
        except ImportError as err:
            raise ValueError(f"{TRACKING_ENV} names mlflow, which is not installed (pip install mlflow-skinny)") from err
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=run_name)
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})

    def log(self, step: int, values: dict[str, float]) -> None:
        # MLflow metric names allow alphanumerics, _ - . space / only
        self.mlflow.log_metrics({k.replace(":", "_"): v for k, v in values.items()}, step=step)

    def final(self, hparams: dict, metrics: dict[str, float]) -> None:
        self.mlflow.log_params({k: str(v)[:500] for k, v in hparams.items()})
        self.mlflow.log_metrics({k.replace(":", "_"): v for k, v in metrics.items()})

    def close(self) -> None:
        self.mlflow.end_run()
