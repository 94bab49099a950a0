"""RunSpec: one run of one task (task × variant × preset × seed × overrides), and its content-addressed id."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

PRESETS = ("tiny", "small", "paper")
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_name(kind: str, name: str) -> str:
    """Names of suites, tasks, variants and presets become file and folder names: letters, digits, '.', '_', '-'
    only, and no '..'. Anything else fails with a clear error."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"invalid {kind} name {name!r}: use letters, digits, '.', '_' and '-' only (no '..')")
    return name


def slug(text: str) -> str:
    """A file-name-safe form of any text (for names built from stored results)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).replace("..", "_").strip("._") or "_"


@dataclass(frozen=True)
class RunSpec:
    """What to run. Two equal specs under the same code version get the same ``run_id``."""

    task: str
    variant: str
    preset: str = "tiny"
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)  # task config keys -> values (--set key=value)
    code_version: str = ""  # task version + quest-core version, filled in by the registry; part of the run_id

    def canonical(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def run_id(self) -> str:
        """sha256 of the canonical spec (including the code version), 16 hex digits."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "run_id": self.run_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunSpec":
        """The spec in a spec.json (its other keys, such as the run_id and the data root, are left out)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def label(self) -> str:
        sets = ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))
        return f"{self.task}/{self.variant}/{self.preset}/seed{self.seed}" + (f"[{sets}]" if sets else "")
