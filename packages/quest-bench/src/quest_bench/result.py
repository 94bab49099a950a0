"""The result schema, as code: what every run writes to ``result.json`` and the results database."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "diverged", "failed"]
SCHEMA_VERSION = 1


@dataclass
class RunResult:
    run_id: str  # sha256 of the canonical RunSpec and code version (RunSpec.run_id)
    task: str  # registered task name, e.g. "spurious"
    task_version: str  # the task's version string; bump it when its numbers can change
    variant: str  # quest_core attention variant, e.g. "quest"
    preset: str  # "tiny" | "small" | "paper"
    seed: int  # the run's seed (data and model)
    overrides: dict[str, Any]  # task config keys set on top of the preset (--set / suite grid)
    status: Status  # ok: finished; diverged: NaN/inf loss or exploding logits (a result); failed: an error
    reason: str = ""  # why not ok: the divergence or the error message
    diverged_step: int | None = None  # the training step at which divergence was detected
    metrics: dict[str, float] = field(default_factory=dict)  # all final metrics, by name
    primary_metric: str = ""  # the task's headline metric (a key of metrics)
    higher_is_better: bool = True  # direction of the primary metric
    metric_directions: dict[str, bool] = field(default_factory=dict)  # leaderboard metrics -> higher is better
    validation_metric: str = ""  # the primary metric on a validation split (what a -tuned suite selects by)
    telemetry: dict[str, float] = field(default_factory=dict)  # final quest_core telemetry summary (max over layers)
    cost: dict[str, float] = field(default_factory=dict)  # wall_s, peak_rss_mib (or peak_cuda_mib), samples_per_s
    env: dict[str, Any] = field(default_factory=dict)  # package versions, git sha, dirty flag, device, host, python
    data: dict[str, str] = field(default_factory=dict)  # dataset name and content hash or revision
    config: dict[str, Any] = field(default_factory=dict)  # the task's full resolved config
    resumed_from_step: int = 0  # the checkpoint step a restarted run resumed from (0: trained from the start)
    finished_at: str = ""  # when the run ended, ISO 8601 UTC ("" in results written before this field existed)
    schema_version: int = SCHEMA_VERSION  # version of this schema

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=float)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        known = cls.__dataclass_fields__
        missing = [k for k in ("run_id", "task", "variant", "status") if k not in data]
        if missing:
            raise ValueError(f"result is missing required fields {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})
