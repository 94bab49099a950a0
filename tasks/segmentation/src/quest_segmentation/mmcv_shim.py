"""The two environment fixes mmsegmentation 1.2.2 needs on this stack (mmcv-lite, torch 2.11 checkpoints).

1. ``mmcv-lite`` (mmcv without compiled ops; full mmcv is a ~45-minute source build) has no ``mmcv._ext``, so
   ``mmcv/ops/__init__.py`` fails to import, and a few mmseg modules import ``mmcv.ops`` unguarded (point
   sampling, focal loss, mask classification). ``install_mmcv_ops_shim`` registers an ``mmcv.ops`` package that
   exposes mmcv's own pure-torch ``point_sample`` / ``bilinear_grid_sample`` (from ``mmcv/ops/point_sample.py``)
   and, for every other name, a placeholder that raises a clear error when used. Models made of ViT, Segmenter,
   UPerNet, SegFormer and FCN-style heads need none of the compiled ops.
2. mmengine 0.10.7 calls ``torch.load`` without ``weights_only``; torch >= 2.6 defaults it to True and refuses the
   numpy objects and mmengine classes in mmengine checkpoints (``Runner(resume=True)``, ``load_checkpoint``).
   ``allow_mmengine_checkpoints`` adds exactly those globals to torch's allow-list instead of turning the check
   off for everything (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, or upstream's own fix, ``weights_only=False``).
   One more thing blocks it: mmengine pickles the message hub's ``HistoryBuffer`` with its statistics functions,
   stored as ``getattr(HistoryBuffer, "min")``, and allow-listing ``getattr`` would defeat the check. Those
   functions live in a class-level registry that every process rebuilds on import, so ``HistoryBuffer`` is made
   to pickle without them. Checkpoints written before this patch (by plain mmengine) still need a trusted,
   unsafe load to resume; weights-only checkpoints (``state_dict`` + ``meta``) load either way.

``quest_segmentation`` calls both on import, before mmseg is imported.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def _missing_op(name: str) -> type:
    def fail(*args, **kwargs):
        raise ModuleNotFoundError(
            f"mmcv.ops.{name} needs mmcv's compiled extensions, and this environment has mmcv-lite (no compiled "
            f"ops; see quest_segmentation.mmcv_shim). Use a model without it (ViT/Segmenter/UPerNet/SegFormer "
            f"heads work), or install full mmcv 2.1.0 built for this torch."
        )

    return type(name, (), {"__init__": fail, "__call__": fail, "__doc__": "Placeholder: needs mmcv compiled ops."})


def install_mmcv_ops_shim() -> bool:
    """Make ``import mmcv.ops`` work on mmcv-lite. Returns True if the shim was installed (False: real ops exist)."""
    if importlib.util.find_spec("mmcv._ext") is not None or "mmcv.ops" in sys.modules:
        return False
    import mmcv

    ops_dir = Path(mmcv.__file__).parent / "ops"
    ops = types.ModuleType("mmcv.ops", "mmcv-lite shim (quest_segmentation.mmcv_shim): pure-torch ops only.")
    ops.__path__ = [str(ops_dir)]  # submodules that are pure torch (point_sample) import from mmcv's own files

    def missing(name: str):
        if name.startswith("__"):  # keep Python's own protocol lookups (__file__, __all__, ...) normal
            raise AttributeError(name)
        return _missing_op(name)

    ops.__getattr__ = missing
    sys.modules["mmcv.ops"] = ops
    mmcv.ops = ops
    from mmcv.ops.point_sample import bilinear_grid_sample, point_sample

    ops.point_sample, ops.bilinear_grid_sample = point_sample, bilinear_grid_sample
    return True


def _history_buffer_state(self) -> dict:
    """``HistoryBuffer``'s state without the statistics functions (``__setstate__`` restores the defaults)."""
    return {k: v for k, v in self.__dict__.items() if k != "statistics_methods"}


def allow_mmengine_checkpoints() -> None:
    """Allow-list the globals mmengine writes into checkpoints for ``torch.load(weights_only=True)``."""
    import numpy as np
    import torch
    from mmengine.logging import HistoryBuffer

    HistoryBuffer.__getstate__ = _history_buffer_state
    torch.serialization.add_safe_globals([
        HistoryBuffer,  # the message hub's running logs
        np.core.multiarray._reconstruct, np.core.multiarray.scalar, np.ndarray, np.dtype,  # numpy values in them
        *{type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")},
    ])


# Importing this module installs both fixes (idempotent): import it before mmseg, mmcv or mmengine.
install_mmcv_ops_shim()
allow_mmengine_checkpoints()
