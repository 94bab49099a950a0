"""Where quest-bench looks for a project's files (``configs/suites/*.yaml``, the ``infra/`` cluster manifests, the
git checkout whose sha a run records): the project folder, ``QUEST_BENCH_ROOT`` if set, else the current working
directory. Installed code never assumes it lives inside a checkout."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "QUEST_BENCH_ROOT"


def project_root() -> Path:
    """The project folder: ``$QUEST_BENCH_ROOT`` if set (a folder that must exist), else the current directory."""
    given = os.environ.get(ROOT_ENV)
    if not given:
        return Path.cwd()
    root = Path(given).expanduser()
    if not root.is_dir():
        raise ValueError(f"{ROOT_ENV}={given!r} is not a folder; set it to the project folder that holds "
                         "configs/suites (or unset it to use the current directory)")
    return root.resolve()


def suites_dir() -> Path:
    """The folder that named suites are read from: ``<project>/configs/suites``."""
    return project_root() / "configs" / "suites"


def infra_dir() -> Path:
    """The folder of the shipped cluster manifests: ``<project>/infra``."""
    return project_root() / "infra"
