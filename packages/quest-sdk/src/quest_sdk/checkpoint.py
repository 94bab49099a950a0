"""Where a run's checkpoint lives: one file in the run's folder, replaced atomically."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

CHECKPOINT = "checkpoint.pt"


class FolderCheckpoints:
    """The latest checkpoint of a run as ``<run folder>/checkpoint.pt``. Written to a side file and renamed, so an
    interrupted save leaves the previous checkpoint intact; read with ``torch.load(weights_only=True)``. Only the
    main worker of a data-parallel run writes (``write=False`` elsewhere)."""

    def __init__(self, folder: Path, write: bool = True):
        self.path, self.write = Path(folder) / CHECKPOINT, write

    def save(self, state: dict, step: int) -> None:
        if not self.write:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)

    def load(self) -> dict | None:
        """The saved state, or None without one. An unreadable checkpoint is reported and the run starts over."""
        if not self.path.exists():
            return None
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or foreign file: starting over loses time, not results
            print(f"warning: ignoring unreadable checkpoint {self.path} ({type(err).__name__}: {err}); "
                  "training starts from step 0", file=sys.stderr)
            return None
