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


def shuffled_class_pools(labels, gen):
    """The indices of each class of ``labels`` (a 1-D tensor; classes in sorted order), each in a random order drawn
    from the torch Generator ``gen``: the draw both stratified samplers below take their examples from."""
    import torch

    return [pool[torch.randperm(len(pool), generator=gen)]
            for pool in (torch.nonzero(labels == c).flatten() for c in labels.unique())]


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
    pools = shuffled_class_pools(labels, gen)
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
    for validation (what a ``-tuned`` suite selects hyper-parameters on); the same for every run, with at least one
    example of every class on each side. ``labels``: any values numpy can sort (class ids, names).

    ``round(fraction * len(labels))`` examples (at least one per class) are shared out in proportion to the class
    sizes (largest remainders get the rounding) and drawn at random within each class (``seed``, fixed by default:
    never the run's seed). ``fraction`` 0 gives no validation examples.
    """
    import numpy as np
    import torch

    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    codes = torch.from_numpy(np.unique(np.asarray(labels).reshape(-1), return_inverse=True)[1].reshape(-1))
    n = len(codes)
    if not fraction:
        return torch.arange(n), torch.zeros(0, dtype=torch.long)
    counts = torch.bincount(codes)
    size = max(round(fraction * n), len(counts))  # at least one example of every class
    if (counts < 2).any() or n - size < len(counts):
        why = ("a class has a single example" if (counts < 2).any() else
               f"{n - size} examples would be left to train on, fewer than the {len(counts)} classes")
        raise ValueError(f"cannot hold out a stratified {fraction:g} of {n} training examples: {why}")
    quota = size * counts.double() / n
    take = quota.floor().long().clamp(min=1).minimum(counts - 1)
    while take.sum() < size:  # the largest remainders among the classes with room get one more
        take[torch.where(take < counts - 1, quota - take, -torch.inf).argmax()] += 1
    while take.sum() > size:  # the smallest remainders among the classes above one give one back
        take[torch.where(take > 1, quota - take, torch.inf).argmin()] -= 1
    pools = shuffled_class_pools(codes, torch.Generator().manual_seed(seed))
    val = torch.cat([pool[:k] for pool, k in zip(pools, take.tolist())]).sort().values
    train = torch.ones(n, dtype=torch.bool)
    train[val] = False
    return torch.nonzero(train).flatten(), val
