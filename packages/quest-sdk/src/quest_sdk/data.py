"""Data helpers every task shares: the cache folder, atomic builds of generated datasets, the data root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

# Generated datasets and processed caches live here (``QUEST_BENCH_CACHE`` moves it), never in the source tree.
CACHE = Path(os.environ.get("QUEST_BENCH_CACHE", Path.home() / ".cache" / "quest-bench"))


def build_once(root: Path, build: Callable[[Path], None], done: str) -> Path:
    """``root``, built on first use by ``build(folder)``; ``root / done`` marks a complete build.

    Parallel runs each build into their own temporary folder and rename it into place (atomic; the loser's copy,
    of the same content, is deleted), so no run ever reads a half-built dataset. An incomplete folder left by an
    interrupted older build is replaced.
    """
    root = Path(root)
    if (root / done).exists():
        return root
    tmp = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        if not (tmp / done).exists():
            raise RuntimeError(f"building {root} did not write its completion marker {done!r}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if root.exists() and not (root / done).exists():
        shutil.rmtree(root, ignore_errors=True)
    try:
        tmp.rename(root)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def require_data_root(data_root: str | None, dataset: str) -> Path:
    """``data_root`` as a Path, or a clear error for a dataset that is only read from ``--data-root``."""
    if not data_root:
        raise ValueError(f"dataset {dataset!r} is read from --data-root; none given")
    return Path(data_root)


def stratified_subset(labels, n: int, seed: int):
    """Indices (sorted, int64 tensor) of ``n`` examples balanced over the classes in ``labels`` and drawn at random
    within each class (seeded), for evaluations too costly to run on the whole test set (attacks, corruptions).

    Each class gets ``n // classes`` examples, the remainder going to randomly chosen classes; a class with fewer
    examples gives all it has and the others fill up to ``n``. ``n <= 0`` or ``n >= len(labels)`` keeps everything.
    A first-``n`` slice of a class-sorted test set would instead evaluate only the first classes.
    """
    import torch

    labels = torch.as_tensor(labels).reshape(-1)
    if n <= 0 or n >= len(labels):
        return torch.arange(len(labels))
    gen = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    pools = [torch.nonzero(labels == c).flatten() for c in classes]
    pools = [pool[torch.randperm(len(pool), generator=gen)] for pool in pools]
    order = torch.randperm(len(pools), generator=gen).tolist()  # who gets the remainder, and fills up first
    take = [0] * len(pools)
    remaining = n
    while remaining:  # round-robin: one more from each class that still has examples
        progressed = False
        for i in order:
            if remaining and take[i] < len(pools[i]):
                take[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            break
    return torch.cat([pool[:k] for pool, k in zip(pools, take)]).sort().values


SPLIT_SEED = 0  # validation splits are fixed per dataset, never drawn from the run's seed


def validation_split(labels, fraction: float, seed: int = SPLIT_SEED):
    """Sorted (train, validation) index tensors: a class-stratified ``fraction`` of the training examples held out
    for validation (what a ``-tuned`` suite selects hyper-parameters on), through scikit-learn's
    ``train_test_split``; the same for every run, with at least one example of every class. ``fraction`` 0 gives
    no validation examples."""
    import numpy as np
    import torch
    from sklearn.model_selection import train_test_split

    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    labels = np.asarray(labels).reshape(-1)
    idx = np.arange(len(labels))
    if not fraction:
        return torch.from_numpy(idx), torch.zeros(0, dtype=torch.long)
    size = max(round(fraction * len(labels)), len(np.unique(labels)))  # at least one example of every class
    try:
        train, val = train_test_split(idx, test_size=size, stratify=labels, random_state=seed)
    except ValueError as err:
        raise ValueError(f"cannot hold out a stratified {fraction:g} of {len(labels)} training examples: {err}") from None
    return torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(val))
