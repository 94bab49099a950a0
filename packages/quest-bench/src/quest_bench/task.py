"""The task plug-in API: what a domain package provides, and the context a run reports through."""

from __future__ import annotations

import abc
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm


class Diverged(Exception):
    """Raised by a task when training diverged: recorded as status="diverged", never retried."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step, self.reason = step, reason


@dataclass(frozen=True)
class Resources:
    """What one run of a preset needs from a Ray node."""

    num_cpus: float = 1
    num_gpus: float = 0


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
    leaderboard_metrics: ClassVar[dict[str, bool]] = {}  # extra metrics -> higher is better (robustness etc.)
    config_class: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, Any]]]
    resources: ClassVar[dict[str, Resources]] = {}

    def resources_for(self, preset: str) -> Resources:
        return self.resources.get(preset, Resources())

    def metric_directions(self) -> dict[str, bool]:
        return {self.primary_metric: self.higher_is_better, **self.leaderboard_metrics}

    def make_config(self, preset: str, overrides: dict[str, Any]):
        """The typed config for a preset plus overrides; unknown presets or keys fail with the valid ones."""
        if preset not in self.presets:
            raise ValueError(f"task {self.name!r} has no preset {preset!r}; valid presets: {', '.join(self.presets)}")
        fields = {f.name: f for f in dataclasses.fields(self.config_class)}
        values = dict(self.presets[preset])
        for key, value in overrides.items():
            if key not in fields:
                raise ValueError(
                    f"task {self.name!r} has no config key {key!r}; valid keys: {', '.join(sorted(fields))}"
                )
            values[key] = coerce(value, type(getattr(self.config_class(), key)), key)
        return self.config_class(**values)

    @abc.abstractmethod
    def run(self, config: Any, ctx: "RunContext") -> TaskOutput:
        """Build data and model from ``config``, train, evaluate; report through ``ctx``."""


def coerce(value: Any, kind: type, key: str) -> Any:
    """Turn a --set string or a YAML value into the field's type, or fail with a clear error."""
    if kind is str:
        return str(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if kind is bool and text in ("true", "false", "1", "0"):
            return text in ("true", "1")
        try:
            value = int(text) if kind is int else float(text) if kind is float else value
        except ValueError:
            pass  # not a number: the type check below reports it
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else
          isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else True)
    if not ok:
        raise ValueError(f"config key {key!r} expects {kind.__name__}, got {value!r}")
    return float(value) if kind is float else value


class RunContext:
    """What a running task reports through: progress, training curves (events.jsonl), divergence checks."""

    def __init__(self, out_dir: Path, variant: str, seed: int = 0, device: str = "cpu", data_root: str | None = None,
                 progress: bool = True, max_logit: float = 1e4, fault_diverge_step: int | None = None):
        self.out_dir, self.variant, self.seed = Path(out_dir), variant, seed
        self.device, self.data_root = device, data_root
        self.progress, self.max_logit_limit = progress, max_logit
        self.fault_diverge_step = fault_diverge_step  # test-only fault injection (see quest_bench.runner)
        self.telemetry_last: dict[str, float] = {}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._events = open(self.out_dir / "events.jsonl", "w")

    def bar(self, total: int, desc: str):
        return tqdm(total=total, desc=desc, disable=not self.progress, leave=False, dynamic_ncols=True)

    def log(self, step: int, values: dict[str, float]) -> None:
        """Append one row of training curves (loss, telemetry, task-specific values) to events.jsonl."""
        self._events.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()}}) + "\n")
        self._events.flush()

    def check(self, step: int, loss: float, telemetry: dict[str, float] | None = None) -> None:
        """Raise Diverged on a non-finite loss or exploding attention logits."""
        if self.fault_diverge_step is not None and step >= self.fault_diverge_step:
            loss = math.nan
        if not math.isfinite(loss):
            raise Diverged(step, f"loss is {loss}")
        if telemetry:
            self.telemetry_last = telemetry
            logit = telemetry.get("max_logit", 0.0)
            if not math.isfinite(logit) or logit > self.max_logit_limit:
                raise Diverged(step, f"max attention logit {logit:.3g} > {self.max_logit_limit:g}")

    def close(self) -> None:
        self._events.close()
