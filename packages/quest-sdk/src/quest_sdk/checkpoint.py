"""Where a run's checkpoint lives: one file in the run's folder, replaced atomically. A checkpoint that cannot be
used (unreadable, or another architecture or version) is set aside once and training starts over; a second one is
an error."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import torch

CHECKPOINT = "checkpoint.pt"
SET_ASIDE = "checkpoint.unusable.pt"  # the checkpoint set aside, beside the run's other files
SET_ASIDE_LOG = "checkpoint.unusable.txt"  # when and why, one line per checkpoint set aside


class UnusableCheckpoint(RuntimeError):
    """A second checkpoint of the same run that cannot be used: the run fails with both reasons instead of
    starting over again."""


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
        """The saved state, or None without one. An unreadable checkpoint is set aside (``set_aside``) and the run
        starts over."""
        if not self.path.exists():
            return None
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or foreign file: starting over loses time, not results
            self.set_aside(f"{type(err).__name__}: {err}", kind="unreadable")
            return None

    def set_aside(self, reason: str, kind: str = "unusable") -> None:
        """Rename the checkpoint to ``checkpoint.unusable.pt`` and append the reason to ``checkpoint.unusable.txt``
        (the run's record of it), so the run starts over once; if one was set aside before, raise
        ``UnusableCheckpoint`` instead (the run fails and says why, rather than starting over forever)."""
        record_set_aside(self.path.parent, self.path, reason, kind, move=self.write)


def record_set_aside(folder: Path | None, checkpoint: Path, reason: str, kind: str = "unusable",
                     move: bool = True) -> None:
    """Set ``checkpoint`` aside for run folder ``folder``, the one rule of every checkpoint store: raise
    ``UnusableCheckpoint`` if ``folder/checkpoint.unusable.txt`` records an earlier one, else warn, and (``move``)
    rename the file to ``folder/checkpoint.unusable.pt`` when it lies under ``folder`` and append the reason to the
    log. ``folder=None`` (a worker that keeps no run folder) only warns."""
    reason = " ".join(str(reason).split())[:500]
    if folder is None:
        print(f"warning: ignoring {kind} checkpoint {checkpoint} ({reason}); training starts from step 0",
              file=sys.stderr)
        return
    folder = Path(folder)
    log = folder / SET_ASIDE_LOG
    if log.exists():
        first = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise UnusableCheckpoint(f"{kind} checkpoint {checkpoint} ({reason}), and an earlier one was set "
                                 f"aside already ({first[0]}); remove both to start over")
    # a file under the run folder is moved; a copy the checkpoint store owns (Ray Train's) is recorded, left in place
    moved = move and folder.resolve() in Path(checkpoint).resolve().parents and Path(checkpoint).exists()
    done = (f"set aside as {folder / SET_ASIDE}, " if moved else f"recorded in {log}, " if move else "")
    print(f"warning: ignoring {kind} checkpoint {checkpoint} ({reason}); {done}training starts from step 0",
          file=sys.stderr)
    if not move:
        return
    if moved:
        os.replace(checkpoint, folder / SET_ASIDE)
    where = f"set aside as {SET_ASIDE}" if moved else "ignored"
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(log, "a") as f:
        f.write(f"{stamp} {Path(checkpoint).name} {where}, {kind}: {reason}\n")
