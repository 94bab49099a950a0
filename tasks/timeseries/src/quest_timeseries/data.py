"""UEA multivariate time-series classification sets as padded tensors: values (N, T, C), a mask of observed steps
(N, T), labels (N,), split into train / validation / test.

- ``JapaneseVowels`` (default) and ``BasicMotions`` ship with aeon, as the archive's ``.ts`` files
  (``aeon/datasets/data/<Name>/<Name>_{TRAIN,TEST}.ts``): read from there, offline; nothing is downloaded.
- Any other UEA set is read from ``--data-root`` in the archive's official layout
  ``<root>/Multivariate_ts/<Name>/<Name>_TRAIN.ts`` and ``<Name>_TEST.ts``.

Both go through aeon's ``load_from_ts_file`` (equal-length sets as a 3-D array, variable-length ones as a list of
(C, T_i) arrays). What aeon lacks is written here: padding to (N, T, C) with an observed-step mask (a step is observed
if any channel is finite; NaN channels of an observed step become 0, the channel mean after standardisation),
per-channel standardisation with the statistics of the training part (observed steps only), and the validation
split: a stratified ``val_fraction`` of the official TRAIN set (``quest_sdk.data.validation_split``, with a fixed
seed), so that every run seed and every variant sees the same split. The model trains on the rest; the official
TEST set is only evaluated.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quest_sdk.data import require_data_root, validation_split

SHIPPED = ("JapaneseVowels", "BasicMotions")  # in aeon's wheel


@dataclass
class Series:
    x: torch.Tensor  # (N, T, C) float32, standardised, 0 at unobserved and padded steps
    observed: torch.Tensor  # (N, T) bool: False at padding (and at missing steps)
    y: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, idx) -> "Series":
        return Series(self.x[idx], self.observed[idx], self.y[idx])


@dataclass
class SeriesData:
    train: Series  # the official TRAIN set less the validation part
    val: Series
    test: Series  # the official TEST set
    classes: list[str]
    revision: str  # the files' sha256


def shipped_folder() -> Path:
    import aeon.datasets

    return Path(aeon.datasets.__file__).parent / "data"


def ts_files(dataset: str, data_root: str | None) -> tuple[Path, Path]:
    """The TRAIN and TEST ``.ts`` files of ``dataset``: aeon's copy for the shipped sets, else the UEA layout under
    ``data_root``."""
    if not dataset or any(sep in dataset for sep in "/\\") or dataset.startswith("."):
        raise ValueError(f"dataset must be a UEA problem name such as 'JapaneseVowels', got {dataset!r}")
    if dataset in SHIPPED:
        folder = shipped_folder() / dataset
    else:
        root = require_data_root(data_root, dataset)
        folder = root / "Multivariate_ts" / dataset
    paths = (folder / f"{dataset}_TRAIN.ts", folder / f"{dataset}_TEST.ts")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"dataset {dataset!r}: no {' or '.join(missing)}; expected the UEA archive layout "
                                f"<data-root>/Multivariate_ts/{dataset}/{dataset}_{{TRAIN,TEST}}.ts (shipped without "
                                f"a data root: {', '.join(SHIPPED)})")
    return paths


def read_ts(path: Path) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """aeon's reader: the series as (C, T_i) float arrays, the labels (strings) and the header's class order."""
    from aeon.datasets import load_from_ts_file

    x, y, meta = load_from_ts_file(str(path), return_meta_data=True)
    series = [np.asarray(s, dtype=np.float64) for s in x]
    labels = np.asarray(y).astype(str)
    return series, labels, [str(c) for c in meta.get("class_values") or []]


def pad(series: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, T_i) arrays as values (N, T, C) with NaN kept and an observed mask (N, T); T = the longest series."""
    length = max(s.shape[1] for s in series)
    x = np.full((len(series), length, series[0].shape[0]), np.nan, dtype=np.float64)
    for i, s in enumerate(series):
        if s.shape[0] != x.shape[2]:
            raise ValueError(f"series {i} has {s.shape[0]} channels, the first has {x.shape[2]}")
        x[i, : s.shape[1]] = s.T
    observed = np.isfinite(x).any(-1)
    return torch.from_numpy(x), torch.from_numpy(observed)


def channel_stats(x_ntc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over finite values (NaN = padding or missing); std 1 for a constant channel."""
    finite = torch.isfinite(x_ntc)
    count = finite.sum((0, 1)).clamp_min(1)
    values = torch.where(finite, x_ntc, 0.0)
    mean = values.sum((0, 1)) / count
    var = torch.where(finite, (x_ntc - mean) ** 2, 0.0).sum((0, 1)) / count
    std = var.sqrt()
    return mean, torch.where(std > 1e-8, std, torch.ones_like(std))


def standardise(x_ntc: torch.Tensor, observed_nt: torch.Tensor, mean, std) -> torch.Tensor:
    z = (x_ntc - mean) / std
    return torch.where(torch.isfinite(z) & observed_nt[..., None], z, 0.0).float()


def load(dataset: str, data_root: str | None, val_fraction: float = 0.2) -> SeriesData:
    train_path, test_path = ts_files(dataset, data_root)
    train_series, train_labels, classes = read_ts(train_path)
    test_series, test_labels, _ = read_ts(test_path)
    seen = sorted(set(train_labels) | set(test_labels))
    if not set(seen) <= set(classes):
        classes = seen  # no (or an incomplete) @classLabel header: sorted label order
    index = {c: i for i, c in enumerate(classes)}
    y_train = torch.tensor([index[c] for c in train_labels])
    y_test = torch.tensor([index[c] for c in test_labels])
    x_train, obs_train = pad(train_series)
    x_test, obs_test = pad(test_series)
    fit, held_out = (t.numpy() for t in validation_split(train_labels, val_fraction))
    mean, std = channel_stats(x_train[fit])
    train = Series(standardise(x_train, obs_train, mean, std), obs_train, y_train)
    test = Series(standardise(x_test, obs_test, mean, std), obs_test, y_test)
    digest = hashlib.sha256(train_path.read_bytes() + test_path.read_bytes()).hexdigest()[:16]
    return SeriesData(train.subset(torch.from_numpy(fit)), train.subset(torch.from_numpy(held_out)), test, classes,
                      f"{train_path.name}+{test_path.name} sha256:{digest}")
