"""The task plug-in API: what a domain package provides, and the context a run reports through."""

from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm

from quest_sdk.config import make_config


class Diverged(Exception):
    """Raised by a task when training diverged: recorded as status="diverged", never retried."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step, self.reason = step, reason


# A sweep cancels a run that takes longer than this (``--run-timeout`` overrides it for every run of a sweep).
DEFAULT_TIMEOUT_S = {"tiny": 3600.0, "small": 12 * 3600.0, "paper": 7 * 24 * 3600.0}


# The sustained training rate a GPU-hour estimate assumes when nothing better is known: an assumption, not a
# measurement (``make gpu-check`` prints the rate the lm reaches on a real GPU; ``sweep --dry-run --gpu-tflops``).
ASSUMED_GPU_TFLOPS = 30.0
# A run whose time is estimated (``Throughput``) may take this many times the estimate before a sweep cancels it:
# the estimate assumes a sustained rate that small models and data-bound recipes do not reach.
TIMEOUT_OVER_ESTIMATE = 10.0
TIMEOUT_FLOOR_S = 24 * 3600.0  # small models are bound by per-step overheads a FLOP count does not see


def transformer_train_flops(depth: int, dim: int, tokens: int, mlp_ratio: float = 4.0,
                            extra_params: float = 0.0) -> float:
    """Training FLOPs per sample of a transformer encoder/decoder: forward = 2 x (multiply-adds of the QKV and output
    projections, the MLP and the attention scores and values) per token per layer, plus ``extra_params`` (embedding
    and head weights used once per token); backward = 2 x forward (the usual 6 N T rule, with attention)."""
    per_token_layer = 4 * dim * dim + 2 * mlp_ratio * dim * dim + 2 * tokens * dim
    forward = 2 * tokens * (depth * per_token_layer + extra_params)
    return 3 * forward


@dataclass(frozen=True)
class Throughput:
    """An estimate of what one run of a preset computes, for GPU-hour estimates and timeouts
    (``Task.gpu_hours``): ``train_samples`` samples of ``flops_per_sample`` training FLOPs each, at a sustained
    rate per GPU that the caller assumes (``ASSUMED_GPU_TFLOPS`` unless calibrated). Evaluation is not counted."""

    train_samples: float  # samples one run trains on (epochs x training-set size, or steps x global batch)
    flops_per_sample: float  # training FLOPs per sample (``transformer_train_flops`` for transformers)
    basis: str  # where the numbers come from, shown by ``sweep --dry-run``

    def __post_init__(self):
        if not (self.train_samples > 0 and self.flops_per_sample > 0):
            raise ValueError(f"a throughput declaration needs train_samples > 0 and flops_per_sample > 0, got "
                             f"{self.train_samples} and {self.flops_per_sample}")

    def gpu_hours(self, gpu_tflops: float = ASSUMED_GPU_TFLOPS) -> float:
        """GPU-hours of one run (over all its workers) at ``gpu_tflops`` sustained per GPU: an estimate."""
        if not gpu_tflops > 0:
            raise ValueError(f"the sustained GPU rate must be > 0 TFLOP/s, got {gpu_tflops}")
        return self.train_samples * self.flops_per_sample / (gpu_tflops * 1e12) / 3600


@dataclass(frozen=True)
class Resources:
    """What one run of a preset needs from a Ray cluster, and how long it may take. With ``workers`` > 1 the run
    trains data-parallel on that many Ray Train workers, each with ``num_cpus``, ``num_gpus`` and ``memory_gb``."""

    num_cpus: float = 1  # per worker
    num_gpus: float = 0  # per worker
    timeout_s: float = 0.0  # 0 = from the throughput estimate when declared, else the preset's default
    workers: int = 1
    threads: int = 0  # torch threads per worker; 0 = num_cpus (at least 1). Fixed per preset: results depend on it
    memory_gb: float = 0.0  # host memory reserved per worker (GiB); 0 = none reserved
    throughput: Throughput | None = None  # what a run computes, for GPU-hour estimates (GPU presets)

    @property
    def torch_threads(self) -> int:
        return self.threads or max(1, int(self.num_cpus))


@dataclass
class TaskOutput:
    """What ``Task.run`` returns."""

    metrics: dict[str, float]  # final metrics, including the task's primary metric
    data: dict[str, str] = field(default_factory=dict)  # dataset name and content hash
    samples_seen: int = 0  # training samples processed (for throughput)


class Task(abc.ABC):
    """Base class of a task plug-in. Subclasses set the class attributes and implement ``run``.

    ``config_class`` is a dataclass with the task's defaults; ``presets`` maps a preset name to overrides of
    those defaults; ``--set key=value`` overrides on top of the preset, validated against the dataclass fields.
    """

    name: ClassVar[str]
    version: ClassVar[str]  # bump when results can change; part of every run_id
    primary_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    # The primary metric measured on a validation split (same direction): what a ``-tuned`` suite selects each
    # variant's configuration by, so that the reported test metric is not the one it was chosen on.
    validation_metric: ClassVar[str] = ""
    leaderboard_metrics: ClassVar[dict[str, bool]] = {}  # extra metrics -> higher is better (robustness etc.)
    # How the leaderboard reads the task's results (stored with every result, ``conventions``): the training curves
    # of events.jsonl it plots and which of them on a log axis; the grid key of a stability-margin sweep and the 0/1
    # metric that says a run trained stably, with what "stably" means beyond "no divergence"; the robustness metric
    # of the cross-task win rate ("": the first ``corrupted_*`` leaderboard metric, if any).
    curve_keys: ClassVar[tuple[str, ...]] = ("loss", "max_logit", "entropy_mean", "k_norm_max", "q_norm_max")
    log_curve_keys: ClassVar[tuple[str, ...]] = ("loss", "max_logit", "k_norm_max", "q_norm_max")
    stability_axis: ClassVar[str] = "lr"
    stability_metric: ClassVar[str] = "stable"
    stability_note: ClassVar[str] = ""
    robustness_metric: ClassVar[str] = ""
    config_class: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, Any]]]
    resources: ClassVar[dict[str, Resources]] = {}
    # Non-empty: the task cannot train data-parallel (on several workers) yet, and this says why.
    single_worker_reason: ClassVar[str] = ""

    def resources_for(self, preset: str) -> Resources:
        return self.resources.get(preset, Resources())

    def metrics_for(self, config: Any) -> tuple[str, str]:
        """The (primary, validation) metric of a run with ``config``: the class's, unless a task's datasets are
        scored differently (same direction, ``higher_is_better``)."""
        return self.primary_metric, self.validation_metric

    def check_workers(self, workers: int) -> None:
        """Refuse a data-parallel run of a task that cannot train on several workers, saying why."""
        if workers > 1 and self.single_worker_reason:
            raise ValueError(f"task {self.name!r} cannot train on {workers} data-parallel workers: "
                             f"{self.single_worker_reason}; use --workers 1")

    def timeout_for(self, preset: str) -> float:
        """Seconds a run of ``preset`` may take in a sweep before it is cancelled: the declared timeout; else, for a
        preset with a throughput estimate, ``TIMEOUT_OVER_ESTIMATE`` times its estimated wall time on its GPUs (at
        least ``TIMEOUT_FLOOR_S``, at most the preset's default); else the preset's default."""
        res = self.resources_for(preset)
        default = DEFAULT_TIMEOUT_S.get(preset, DEFAULT_TIMEOUT_S["paper"])
        if res.timeout_s:
            return res.timeout_s
        if res.throughput is not None and res.num_gpus > 0:
            wall_s = res.throughput.gpu_hours() * 3600 / (res.workers * res.num_gpus)
            return min(default, max(TIMEOUT_FLOOR_S, TIMEOUT_OVER_ESTIMATE * wall_s))
        return default

    def metric_directions(self) -> dict[str, bool]:
        return {self.primary_metric: self.higher_is_better, **self.leaderboard_metrics}

    @staticmethod
    def default_robustness(metrics) -> str:
        """The robustness metric a task that declares none uses: its first ``corrupted_*`` metric ("" if none)."""
        return next((m for m in metrics if m.startswith("corrupted")), "")

    @classmethod
    def conventions(cls) -> dict[str, Any]:
        """The task's leaderboard conventions as stored in each result (JSON types; the class attributes above)."""
        robustness = cls.robustness_metric or cls.default_robustness(cls.leaderboard_metrics)
        if cls.robustness_metric and cls.robustness_metric not in cls.leaderboard_metrics:
            raise ValueError(f"task {getattr(cls, 'name', cls.__name__)!r}: robustness_metric "
                             f"{cls.robustness_metric!r} is not one of its leaderboard_metrics "
                             f"({', '.join(cls.leaderboard_metrics) or 'none'})")
        unplotted = [k for k in cls.log_curve_keys if k not in cls.curve_keys]
        if unplotted:
            raise ValueError(f"task {getattr(cls, 'name', cls.__name__)!r}: log_curve_keys {unplotted} are not in "
                             f"curve_keys ({', '.join(cls.curve_keys)})")
        return {"curves": list(cls.curve_keys), "log_curves": list(cls.log_curve_keys),
                "stability_axis": cls.stability_axis, "stability_metric": cls.stability_metric,
                "stability_note": cls.stability_note, "robustness_metric": robustness}

    def make_config(self, preset: str, overrides: dict[str, Any]):
        """The typed config for a preset plus overrides; unknown presets or keys, wrong types and values outside a
        field's declared range (``quest_sdk.config.param``) fail with what is valid."""
        if preset not in self.presets:
            raise ValueError(f"task {self.name!r} has no preset {preset!r}; valid presets: {', '.join(self.presets)}")
        return make_config(self.config_class, {**self.presets[preset], **overrides}, f"task {self.name!r}")

    # The values of the config's ``dataset`` key that ship with the task or are generated: they read nothing from
    # --data-root. Every other value is read from there (``check_data``). A task without a ``dataset`` key
    # generates its data and never reads --data-root.
    shipped_datasets: ClassVar[tuple[str, ...]] = ()

    def reads_data_root(self, config) -> bool:
        """Whether a run of ``config`` reads anything from --data-root (a task whose other settings read files from
        there, e.g. pretrained weights, extends this)."""
        dataset = getattr(config, "dataset", None)
        return dataset is not None and dataset not in self.shipped_datasets

    def data_layout(self, config) -> str:
        """The layout under --data-root that ``config``'s dataset expects, for error messages (tasks override)."""
        return "the dataset's files (see the task's data module)"

    def check_layout(self, config, root: Path) -> None:
        """Raise ``ValueError`` (one line that names the expected layout) when ``root`` does not hold the data
        ``config`` reads; cheap checks of names and folders only, nothing is downloaded. Tasks override this."""

    def check_data(self, config, data_root: str | None, look: bool = True) -> None:
        """Before anything runs (at ``resolve``, before Ray starts or a folder is written): a ``ValueError`` when
        --data-root is given but the chosen dataset ignores it (naming the dataset key to set), when the dataset
        needs it and it is missing, or (``look``: when the data root is visible from here) when it does not hold
        the expected layout."""
        dataset = getattr(config, "dataset", None)
        if not self.reads_data_root(config):
            if data_root:
                what = (f"its dataset {dataset!r} ships with it (or is generated)" if dataset is not None
                        else "it generates its data")
                others = ([d for d in fields_choices(config, "dataset") if d not in self.shipped_datasets]
                          if dataset is not None else [])
                hint = (f"; to train on data from there set dataset= one of {', '.join(others)} (--set dataset=...)"
                        if others else "; leave --data-root out" if dataset is None else
                        "; leave --data-root out, or set dataset= to one read from there (--set dataset=...)")
                raise ValueError(f"--data-root {data_root} is given, but task {self.name!r} reads nothing from it: "
                                 f"{what}{hint}")
            return
        if not data_root:
            raise ValueError(f"task {self.name!r}: dataset {dataset!r} is read from --data-root, which is not given; "
                             f"expected under it: {self.data_layout(config)}")
        if not look:
            return
        root = Path(data_root)
        if not root.is_dir():
            raise ValueError(f"--data-root {data_root} is not a folder; expected under it: {self.data_layout(config)}")
        try:
            self.check_layout(config, root)
        except FileNotFoundError as err:  # a data module's own finder: its message names the layout
            raise ValueError(f"task {self.name!r}, dataset {dataset!r}: {err}") from None

    # What runs a config: "module:function", called as function(config, ctx) -> TaskOutput. The module is imported
    # when a run starts, so that listing or checking tasks loads no torch or task stack.
    entry_point: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.entry_point:
            entry_point_parts(cls.entry_point, cls.__name__)

    def run(self, config: Any, ctx: "RunContext") -> TaskOutput:
        """Build data and model from ``config``, train, evaluate; report through ``ctx``: the task's ``entry_point``
        (a task may override ``run`` instead)."""
        return load_entry_point(self.entry_point, f"task {self.name!r}")(config, ctx)


class RunContext:
    """What a running task reports through: progress, training curves (events.jsonl and the trackers of
    ``quest_sdk.tracking``), divergence checks, checkpoints, and its place among data-parallel workers.

    Only the main worker (rank 0) writes; the others train silently. ``checkpoints`` defaults to the run's folder
    (``quest_sdk.checkpoint.FolderCheckpoints``); a Ray Train run passes its own store.
    """

    def __init__(self, out_dir: Path, variant: str, seed: int = 0, device: str = "cpu", data_root: str | None = None,
                 progress: bool = True, max_logit: float = 1e4, checkpoint_every: int = 0, rank: int = 0,
                 world_size: int = 1, checkpoints=None, run_name: str = ""):
        from quest_sdk.checkpoint import FolderCheckpoints

        self.out_dir, self.variant, self.seed = Path(out_dir), variant, seed
        self.device, self.data_root = device, data_root
        self.rank, self.world_size = rank, world_size
        self.is_main = rank == 0
        self.progress, self.max_logit_limit = progress and self.is_main, max_logit
        self.checkpoint_every = checkpoint_every  # steps between checkpoints; 0 = ten per run
        self.checkpoints = checkpoints or FolderCheckpoints(self.out_dir, write=self.is_main)
        self.run_name = run_name or self.out_dir.name
        self.telemetry_last: dict[str, float] = {}
        self.resumed_from_step = 0
        self._bar = self._tracker = None
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._events = None

    def begin(self, step: int) -> None:
        """Training starts (or resumes) after ``step``: curves logged beyond it by an interrupted attempt go."""
        if not self.is_main:
            return
        from quest_sdk.tracking import Tracker

        path = self.out_dir / "events.jsonl"
        kept = [line for line in (path.read_text().splitlines() if path.exists() and step else [])
                if _row_step(line) is not None and _row_step(line) <= step]
        path.write_text("".join(line + "\n" for line in kept))
        self._events = open(path, "a")
        self._tracker = Tracker(self.out_dir, self.run_name, {"variant": self.variant, "seed": self.seed},
                                purge_step=step + 1 if step else None)

    def wrap_model(self, model):
        """The model to train: itself, or a DistributedDataParallel wrapper when one of several workers."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[model_device(model)] if self.device == "cuda" else None)

    def bar(self, total: int, desc: str, unit: str = "step", initial: int = 0):
        """The run's progress bar (steps per second shown as throughput; the loss of the latest logged row is
        added by ``log``)."""
        self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, disable=not self.progress, leave=False,
                         dynamic_ncols=True)
        return self._bar

    def log(self, step: int, values: dict[str, float]) -> None:
        """Append one row of training curves (loss, telemetry, task-specific values) to events.jsonl and the
        trackers (the main worker only)."""
        if not self.is_main:
            return
        if self._events is None:
            self.begin(0)
        values = {k: float(v) for k, v in values.items()}
        self._events.write(json.dumps({"step": step, **values}) + "\n")
        self._events.flush()
        self._tracker.log(step, values)
        if self._bar is not None and "loss" in values:
            self._bar.set_postfix(loss=f"{values['loss']:.3f}", refresh=False)

    def check(self, step: int, loss: float, telemetry: dict[str, float] | None = None) -> None:
        """Raise Diverged on a non-finite loss or exploding attention logits. With several workers the decision is
        global (``agree``): every worker raises at the same step, whichever worker saw it. Called after every
        optimizer step (``quest_sdk.engine.Trainer``): a subclass that overrides it sees every step of the run."""
        bad_rank, loss, telemetry = self.agree(loss, telemetry)
        if not math.isfinite(loss):
            where = f" on worker {bad_rank} of {self.world_size}" if self.world_size > 1 else ""
            raise Diverged(step, f"loss is {loss}{where}")
        if telemetry:
            self.telemetry_last = telemetry
            logit = telemetry.get("max_logit", 0.0)
            if not math.isfinite(logit) or logit > self.max_logit_limit:
                raise Diverged(step, f"max attention logit {logit:.3g} > {self.max_logit_limit:g}")

    def agree(self, loss: float, telemetry: dict[str, float] | None) -> tuple[int, float, dict[str, float] | None]:
        """The step's divergence evidence of every worker, all-reduced (one collective per step, called by every
        worker at every step): the highest rank whose loss is not finite (-1: none; its loss becomes NaN here) and
        the largest max attention logit of all workers. One worker alone returns its own values."""
        import torch
        import torch.distributed as dist

        if self.world_size == 1 or not dist.is_initialized():
            return (-1 if math.isfinite(loss) else self.rank), loss, telemetry
        logit = (telemetry or {}).get("max_logit", -math.inf)
        evidence = torch.tensor([-1.0 if math.isfinite(loss) else float(self.rank),
                                 math.inf if math.isnan(logit) else logit], dtype=torch.float64,
                                device=torch.device(self.device) if self.device != "cpu" else None)
        dist.all_reduce(evidence, op=dist.ReduceOp.MAX)
        bad_rank, logit = int(evidence[0]), float(evidence[1])
        if bad_rank >= 0:
            loss = math.nan if math.isfinite(loss) else loss
        if telemetry:
            telemetry = {**telemetry, "max_logit": logit}
        return bad_rank, loss, telemetry

    def final_metrics(self) -> dict[str, float]:
        """The run's last attention telemetry summary as ``final_<name>`` metrics (``final_max_logit``, ...), which
        the runner adds to every run's metrics: a task does not report them itself."""
        return {f"final_{k}": v for k, v in self.telemetry_last.items()}

    def final(self, hparams: dict, metrics: dict[str, float]) -> None:
        """Record the finished run's settings (task, variant, preset, seed, overrides) and final metrics with the
        trackers (TensorBoard's HParams dashboard), from the main worker."""
        if self._tracker is not None:
            self._tracker.final(hparams, metrics)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
        if self._tracker is not None:
            self._tracker.close()


def entry_point_parts(text: str, owner: str) -> tuple[str, str]:
    """The (module, function) of a "module:function" entry point, or a ``ValueError`` naming what is wrong."""
    module, _, function = text.partition(":")
    if not (module and function and all(part.isidentifier() for part in module.split("."))
            and function.isidentifier()):
        raise ValueError(f"{owner}: entry_point {text!r} is not 'module:function' (e.g. 'quest_lm.experiment:run')")
    return module, function


def load_entry_point(text: str, owner: str):
    """The function a "module:function" entry point names, imported now; a ``ValueError`` naming the entry point
    when it is empty, malformed, its module cannot be imported or the module has no such function."""
    import importlib

    if not text:
        raise ValueError(f"{owner} declares no entry_point ('module:function') and does not override run")
    module_name, name = entry_point_parts(text, owner)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name or module_name.startswith(f"{err.name}."):  # the module, not one it imports
            raise ValueError(f"{owner}: entry_point {text!r}: no module {module_name!r}") from None
        raise
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{owner}: entry_point {text!r}: module {module_name!r} has no function {name!r}")
    return function


def fields_choices(config, key: str) -> tuple:
    """The declared choices of a config field (``quest_sdk.config.param(choices=...)``), or () if it has none."""
    from quest_sdk.config import valid_values

    valid = valid_values(type(config), key)
    return tuple(valid.choices or ()) if valid is not None else ()


def _row_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line of an interrupted attempt


def model_device(model) -> int:
    return next(model.parameters()).device.index or 0
