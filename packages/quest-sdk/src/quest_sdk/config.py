"""Task configs: typed dataclasses whose fields declare their valid values, checked before anything is written.

A field declares its range with ``param``::

    steps: int = param(1500, ge=1)                          # an integer >= 1
    lr: float = param(3e-3, gt=0)                           # a float > 0
    dataset: str = param("digits", choices=("digits", "cifar10"))
    severities: str = param("1,2,3", items=int, ge=1, le=5)  # a comma list of integers in [1, 5] ("" = none)

``make_config`` applies a preset and ``--set`` overrides, coerces each value to its field's type and checks every
field; a bad value fails with the key, the value and the valid range. Checks that involve several fields (a width
divisible by the number of heads) go in the dataclass's ``__post_init__`` and raise ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "quest_bench.valid"


@dataclass(frozen=True)
class Valid:
    """The valid values of one config field: numeric bounds, a set of choices, or a comma list of numbers."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    items: type | None = None  # the field is a comma-separated list of this type, each item within the bounds

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        bounds = [f"{op} {v:g}" for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                  if v is not None]
        what = " and ".join(bounds) if bounds else "any value"
        if self.items is not None:
            return f'a comma-separated list of {self.items.__name__}s, each {what} ("" for none)'
        return what

    def accepts_number(self, x: float) -> bool:
        return (math.isfinite(x) and (self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def accepts(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        if self.items is not None:
            try:
                numbers = [self.items(part) for part in str(value).split(",") if part.strip()]
            except ValueError:
                return False
            return all(self.accepts_number(x) for x in numbers)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True  # strings and flags without choices: any value
        return self.accepts_number(value)


def param(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, choices: tuple[str, ...] | None = None, items: type | None = None):
    """A config field with its default and valid values (see the module docstring)."""
    valid = Valid(ge, gt, le, lt, tuple(choices) if choices is not None else None, items)
    if not valid.accepts(default):
        raise ValueError(f"default {default!r} is not {valid.describe()}")
    return dataclasses.field(default=default, metadata={RANGE_KEY: valid})


def valid_values(config_class: type, key: str) -> Valid | None:
    """The declared valid values of a field (None: any value of its type). A subclass that sets another default
    (``lr: float = 2e-3``) keeps the range its base class declared with ``param``."""
    for cls in config_class.__mro__:
        field = getattr(cls, "__dataclass_fields__", {}).get(key)
        if field is not None and RANGE_KEY in field.metadata:
            return field.metadata[RANGE_KEY]
    if key not in {f.name for f in dataclasses.fields(config_class)}:
        raise KeyError(key)
    return None


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


def typed_values(config_class: type, values: dict[str, Any], owner: str) -> dict[str, Any]:
    """``values`` coerced to their fields' types (``coerce``): the canonical form of overrides, in which ``"3e-3"``
    (YAML 1.1 reads an exponent without a dot as text), ``3e-3`` and ``0.003`` are one float and ``1`` for a float
    field is ``1.0``. Unknown keys and wrong types fail with what is valid; ranges are checked by ``make_config``."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    defaults = config_class()
    typed = {}
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{owner} has no config key {key!r}; valid keys: {', '.join(sorted(fields))}.{hint}")
        typed[key] = coerce(value, type(getattr(defaults, key)), key)
    return typed


def make_config(config_class: type, values: dict[str, Any], owner: str) -> Any:
    """Build ``config_class`` from ``values`` (preset + overrides): unknown keys, wrong types and out-of-range
    values fail with a ``ValueError`` that names the key, the value and what is valid. ``owner`` names the task."""
    typed = typed_values(config_class, values, owner)
    for key, value in typed.items():
        valid = valid_values(config_class, key)
        if valid is not None and not valid.accepts(value):
            raise ValueError(f"{owner}: config key {key!r} = {value!r} is out of range; valid: {valid.describe()}")
    try:
        return config_class(**typed)
    except ValueError as err:  # a check across fields in __post_init__
        raise ValueError(f"{owner}: invalid config: {err}") from None


@dataclass
class TrainingConfig:
    """The optimisation settings of every task that trains through ``quest_sdk.engine``: a task's config inherits
    them (from ``EpochTraining`` or ``StepTraining``, which add the run's length and its warm-up) and sets its own
    defaults by redeclaring a field with a plain value (``lr: float = 2e-3``), keeping the range declared here.
    ``lr`` and ``weight_decay`` default to ``torch.optim.AdamW``'s own defaults.

    Every field is checked against its declared range when the config is built, defaults included, and the
    warm-up may not be longer than the run (``check_warmup``): both fail with a ``ValueError`` naming the values.
    """

    batch_size: int = param(32, ge=1)  # global batch (split over data-parallel workers)
    lr: float = param(1e-3, gt=0)  # AdamW peak, after the linear warm-up; cosine decay after it
    weight_decay: float = param(0.01, ge=0)  # AdamW, on weight matrices and embeddings (engine.decay_groups)
    grad_clip: float = param(0.0, ge=0)  # max global gradient norm (0 = off; the norm is logged either way)
    amp: bool = False  # bfloat16 autocast
    log_every: int = param(10, ge=1)  # steps between telemetry rows in events.jsonl

    def __post_init__(self):
        for field in dataclasses.fields(self):
            valid = valid_values(type(self), field.name)
            value = getattr(self, field.name)
            if valid is not None and not valid.accepts(value):
                raise ValueError(f"{field.name} = {value!r} is out of range; valid: {valid.describe()}")
        check_warmup(self)


@dataclass
class EpochTraining(TrainingConfig):
    """Training for ``epochs`` passes over the training set, warming up for the first ``warmup_epochs``."""

    epochs: int = param(10, ge=1)  # passes over the training set (the last partial batch dropped)
    warmup_epochs: float = param(1.0, ge=0)  # linear warm-up, in (fractional) epochs; at most epochs


@dataclass
class StepTraining(TrainingConfig):
    """Training for ``steps`` optimizer steps, warming up for the first ``warmup_steps``."""

    steps: int = param(1000, ge=1)  # optimizer steps of the run
    warmup_steps: int = param(0, ge=0)  # linear warm-up, in optimizer steps; at most steps


# The warm-up of a run and the run's length, in the units the config declares them in: (warm-up key, length key).
WARMUP_KEYS = (("warmup_steps", "steps"), ("warmup_epochs", "epochs"))


def check_warmup(config) -> None:
    """The one warm-up rule, checked when a config is built: a warm-up (``warmup_steps`` or ``warmup_epochs``) no
    longer than the run (``steps`` or ``epochs``); a longer one is a ``ValueError`` naming both. (A warm-up given as
    ``warmup_frac``, a fraction of the run, is in range by its declaration.)"""
    for warmup_key, length_key in WARMUP_KEYS:
        if hasattr(config, warmup_key) and hasattr(config, length_key):
            warmup, length = getattr(config, warmup_key), getattr(config, length_key)
            if warmup > length:
                raise ValueError(f"the warm-up is longer than the run: {warmup_key}={warmup:g} > {length_key}="
                                 f"{length:g}; set {warmup_key} to at most {length:g} (--set {warmup_key}=...)")
