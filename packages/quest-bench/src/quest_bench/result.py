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
    conventions: dict[str, Any] = field(default_factory=dict)  # how the leaderboard reads it (Task.conventions);
    # {} in results written before this field existed (the leaderboard then asks the task's class)
    telemetry: dict[str, float] = field(default_factory=dict)  # final quest_core telemetry summary (max over layers)
    cost: dict[str, float] = field(default_factory=dict)  # wall_s, peak_rss_mib (or peak_cuda_mib), samples_per_s
    env: dict[str, Any] = field(default_factory=dict)  # package versions, git sha, dirty flag, device, host, python
    data: dict[str, str] = field(default_factory=dict)  # dataset name and content hash or revision
    config: dict[str, Any] = field(default_factory=dict)  # the task's full resolved config
    preset_values: dict[str, Any] = field(default_factory=dict)  # the preset's own value of each overridden key (the
    # default recipe a tuned suite's report shows beside its best cell, without building the task)
    resumed_from_step: int = 0  # the checkpoint step a restarted run resumed from (0: trained from the start)
    finished_at: str = ""  # when the run ended, ISO 8601 UTC ("" in results written before this field existed)
    schema_version: int = SCHEMA_VERSION  # version of this schema

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=float)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        """A result from its JSON object, checked against the schema (``check_record``): a ValueError says which
        field is wrong and what is valid."""
        check_record(data)
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


# ---- the schema, checked on read: a result.json edited by hand, truncated or from elsewhere is refused ------------

SEED_MAX = 2**32 - 1  # numpy's generators take seeds in [0, 2**32)
MAX_DEPTH = 32  # nesting of lists and objects in any field (config, env, overrides)
STATUSES = ("ok", "diverged", "failed")
REQUIRED = ("run_id", "task", "variant", "status")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def depth(value, limit: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in ``value`` (stops counting past ``limit``)."""
    if limit < 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((depth(v, limit - 1) for v in items), default=0)


def check_seed(value, where: str = "seed") -> int:
    """A run's seed: an integer in [0, 2**32) (not a bool, not a float)."""
    if not is_int(value) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{where} must be an integer from 0 to {SEED_MAX}, got {value!r}")
    return value


def check_record(data) -> None:
    """Check a result.json object field by field (types, ranges, nesting depth); raise a ValueError naming the first
    wrong field, its value and what is valid. Unknown keys are ignored (written by a newer version)."""
    from quest_bench.spec import SAFE_NAME

    if not isinstance(data, dict):
        raise ValueError(f"a result is a JSON object, got {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"result is missing required fields {missing}")

    def wrong(key: str, valid: str):
        shown = repr(data[key])
        raise ValueError(f"field {key!r} = {shown[:80]}{'…' if len(shown) > 80 else ''} is invalid; valid: {valid}")

    for key in ("run_id", "task", "variant", "preset"):
        if key in data and not (isinstance(data[key], str) and SAFE_NAME.fullmatch(data[key]) and ".." not in data[key]):
            wrong(key, "a name of letters, digits, '.', '_' and '-'")
    for key in ("task_version", "reason", "primary_metric", "validation_metric", "finished_at"):
        if key in data and not isinstance(data[key], str):
            wrong(key, "a string")
    if data["status"] not in STATUSES:
        wrong("status", " | ".join(STATUSES))
    if "seed" in data and not (is_int(data["seed"]) and 0 <= data["seed"] <= SEED_MAX):
        wrong("seed", f"an integer from 0 to {SEED_MAX}")
    for key in ("resumed_from_step", "schema_version"):
        if key in data and not (is_int(data[key]) and data[key] >= 0):
            wrong(key, "an integer >= 0")
    if data.get("diverged_step") is not None and not (is_int(data["diverged_step"]) and data["diverged_step"] >= 0):
        wrong("diverged_step", "null or an integer >= 0")
    if "higher_is_better" in data and not isinstance(data["higher_is_better"], bool):
        wrong("higher_is_better", "true or false")
    for key in ("metrics", "telemetry", "cost"):  # numbers by name (NaN and inf are allowed: a result may hold them)
        value = data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(k, str) and is_number(v) for k, v in value.items()):
            wrong(key, "an object of numbers by name")
    value = data.get("metric_directions", {})
    if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
        wrong("metric_directions", "an object of true/false (higher is better) by metric name")
    for key in ("overrides", "env", "config", "data", "preset_values"):
        if not isinstance(data.get(key, {}), dict):
            wrong(key, "an object")
        if depth(data.get(key, {})) > MAX_DEPTH:
            wrong(key, f"an object nested at most {MAX_DEPTH} levels")
    value = data.get("conventions", {})  # Task.conventions: curve lists and names
    if not isinstance(value, dict) or not all(
            (isinstance(v, list) and all(isinstance(x, str) for x in v)) if k in ("curves", "log_curves")
            else isinstance(v, str) for k, v in value.items()):
        wrong("conventions", "an object: curves and log_curves lists of names, every other key a string")
    env = data.get("env", {})
    if not isinstance(env.get("packages", {}), dict):
        raise ValueError(f"field 'env.packages' = {env['packages']!r:.80} is invalid; valid: an object of versions")
