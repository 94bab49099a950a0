"""Image datasets: the shipped digits (default) and real layouts read from ``--data-root``.

Every dataset yields (image float (C, H, W) in [0, 1], label); normalisation lives in the model, so corruptions and
attacks work in pixel space.

| dataset  | where                                                   | reader                                        |
|----------|---------------------------------------------------------|-----------------------------------------------|
| digits   | shipped: data/mnist_5k.npz (5,000 MNIST digits)         | 400 train / 100 test per class, fixed split   |
| cifar10  | <root>/cifar-10-batches-py/ (the python pickle batches) | torchvision.datasets.CIFAR10, no download     |
| cifar100 | <root>/cifar-100-python/                                | torchvision.datasets.CIFAR100, no download    |
| imagenet | <root>/train/<wnid>/*.JPEG, <root>/val/<wnid>/*.JPEG    | torchvision.datasets.ImageFolder              |
| ImageNet-C | <root>/imagenet-c/<corruption>/<severity>/<wnid>/*  | ImageFolder, classes mapped to train's        |
| ImageNet-A | <root>/imagenet-a/<wnid>/*                          | ImageFolder over its 200 wnids; logits restricted to them |
| ImageNet-ReaL | <root>/real.json (google-research/reassessed-imagenet) | a list per val image ``ILSVRC2012_val_<n>.JPEG`` |
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset
from torchvision import datasets, transforms

DIGITS_FILE = "mnist_5k.npz"
MEAN_STD = {"digits": ((0.1307,), (0.3081,)), "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
            "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
NUM_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "imagenet": 1000}
CHANNELS = {"digits": 1, "cifar10": 3, "cifar100": 3, "imagenet": 3}
# AlexNet's top-1 error on each ImageNet-C corruption, averaged over the 5 severities: the normaliser of the
# published mCE (Hendrycks & Dietterich 2019; the values of github.com/hendrycks/robustness).
ALEXNET_IMAGENET_C_ERROR = {
    "gaussian_noise": 0.886428, "shot_noise": 0.894468, "impulse_noise": 0.922640, "defocus_blur": 0.819880,
    "glass_blur": 0.826268, "motion_blur": 0.785948, "zoom_blur": 0.798360, "snow": 0.866816, "frost": 0.826572,
    "fog": 0.819324, "brightness": 0.564592, "contrast": 0.853204, "elastic_transform": 0.646056,
    "pixelate": 0.717840, "jpeg_compression": 0.606500,
}


def digits_path() -> Path:
    return Path(str(resources.files("quest_image_cls") / "data" / DIGITS_FILE))


def load_digits() -> tuple[TensorDataset, TensorDataset, str]:
    """The shipped digits split 400/100 per class (fixed), and the file's sha256 (first 16 hex digits)."""
    path = digits_path()
    with np.load(path) as f:
        images, labels = f["images"], f["labels"].astype(np.int64)
    rng = np.random.default_rng(0)
    test_idx = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:100] for c in range(10)])
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[test_idx] = True
    x = torch.from_numpy(images).float().div(255).unsqueeze(1)
    y = torch.from_numpy(labels)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return TensorDataset(x[~is_test], y[~is_test]), TensorDataset(x[is_test], y[is_test]), digest


def require(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{what} not found at {path} (see quest_image_cls.data for the expected layout)")
    return path


def cifar(root: Path, name: str, train: bool, transform) -> Dataset:
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    require(root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"), name)
    return cls(str(root), train=train, transform=transform, download=False)


def imagenet(root: Path, split: str, transform) -> datasets.ImageFolder:
    return datasets.ImageFolder(str(require(root / split, f"ImageNet {split} folder")), transform=transform)


def imagenet_c(root: Path, corruption: str, severity: int, class_to_idx: dict[str, int], transform) -> Dataset:
    """One (corruption, severity) of ImageNet-C, labelled with the training set's class indices."""
    folder = require(root / "imagenet-c" / corruption / str(severity), "ImageNet-C")
    ds = datasets.ImageFolder(str(folder), transform=transform)
    remap = [class_to_idx[c] for c in ds.classes]
    ds.target_transform = remap.__getitem__
    return ds


def imagenet_c_corruptions(root: Path | None) -> list[str]:
    folder = Path(root or "/nonexistent") / "imagenet-c"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def imagenet_real(root: Path | None) -> dict[str, list[int]] | None:
    """ImageNet-ReaL's labels (Beyer et al. 2020), by validation file name, from ``<root>/real.json``: the n-th list
    holds the 1k class indices judged correct for ``ILSVRC2012_val_<n>.JPEG`` (n from 1; an empty list: no label,
    the image is left out). None when the file is absent."""
    import json

    path = Path(root or "/nonexistent") / "real.json"
    if not path.exists():
        return None
    labels = json.loads(path.read_text())
    if not isinstance(labels, list) or not all(isinstance(item, list) for item in labels):
        raise ValueError(f"{path}: ImageNet-ReaL's real.json is a list of label lists (one per validation image)")
    return {f"ILSVRC2012_val_{i + 1:08d}.JPEG": item for i, item in enumerate(labels)}


def imagenet_a(root: Path, class_to_idx: dict[str, int], transform) -> tuple[Dataset, list[int]]:
    """ImageNet-A with labels as 1k indices, and the 1k indices of its classes (to restrict the logits to)."""
    ds = datasets.ImageFolder(str(require(root / "imagenet-a", "ImageNet-A")), transform=transform)
    subset = [class_to_idx[c] for c in ds.classes]
    ds.target_transform = subset.__getitem__
    return ds, subset


def train_transform(dataset: str, img_size: int, randaugment: str = ""):
    """Training augmentation: light crop/flip for small data; timm's RandAugment pipeline for ImageNet."""
    if dataset == "imagenet":
        from timm.data import create_transform

        return create_transform(img_size, is_training=True, auto_augment=randaugment or None, interpolation="bicubic",
                                re_prob=0.25, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # normalising is in the model
    if dataset == "digits":
        return None  # tensors already; see augment_digits
    return transforms.Compose([transforms.RandomCrop(img_size, padding=4), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor()])


def eval_transform(dataset: str, img_size: int):
    if dataset == "imagenet":
        return transforms.Compose([transforms.Resize(int(img_size / 0.875), interpolation=transforms.InterpolationMode.BICUBIC),
                                   transforms.CenterCrop(img_size), transforms.ToTensor()])
    return transforms.ToTensor()


IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
LAYOUTS = {"cifar10": "cifar-10-batches-py/{data_batch_1..5,test_batch} (cifar-10-python.tar.gz, unpacked there)",
           "cifar100": "cifar-100-python/{train,test,meta} (cifar-100-python.tar.gz, unpacked there)",
           "imagenet": "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (a flat val/ as ILSVRC2012_img_val.tar unpacks is "
                       "sorted into class folders by `python -m quest_image_cls.data arrange-val ROOT LABELS`)"}


def check_root(dataset: str, root: Path) -> None:
    """A ``ValueError`` naming the expected layout when ``root`` does not hold ``dataset`` (names only)."""
    expected = f"expected under {root}: {LAYOUTS[dataset]}"
    if dataset.startswith("cifar"):
        folder, files = ((root / "cifar-10-batches-py", ["data_batch_1", "test_batch"]) if dataset == "cifar10"
                         else (root / "cifar-100-python", ["train", "test"]))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise ValueError(f"{dataset}: no {', '.join(missing)} in {folder}; {expected}")
        return
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise ValueError(f"imagenet: no folder {folder}; {expected}")
        flat = next((p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), None)
        if flat is not None:
            raise ValueError(f"imagenet: {folder} holds images directly ({flat.name}, ...), not in class folders: "
                             f"sort them with `python -m quest_image_cls.data arrange-val {root} LABELS`, where LABELS "
                             "is LOC_val_solution.csv (from the Kaggle ImageNet download) or a text file of "
                             "'<image file> <wnid>' lines")
        if not any(p.is_dir() for p in folder.iterdir()):
            raise ValueError(f"imagenet: {folder} has no class folders; {expected}")


def read_val_labels(path: Path) -> dict[str, str]:
    """Image file stem -> wnid, from Kaggle's LOC_val_solution.csv (``ImageId,PredictionString`` whose first word is
    the wnid) or from lines ``<image file> <wnid>``."""
    labels = {}
    for n, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip() or (n == 0 and line.startswith("ImageId")):
            continue
        parts = line.replace(",", " ").split()
        if len(parts) < 2 or not parts[1].startswith("n"):
            raise ValueError(f"{path}, line {n + 1}: expected '<image> <wnid> ...' (LOC_val_solution.csv or "
                             f"'<image file> <wnid>' lines), got {line[:80]!r}")
        labels[Path(parts[0]).stem] = parts[1]
    return labels


def arrange_val(root: Path, labels_file: Path) -> int:
    """Move the images of a flat ``root/val`` into ``root/val/<wnid>/`` (ImageFolder's layout); returns how many moved.
    Every image must have a label; nothing moves otherwise."""
    folder = Path(root) / "val"
    labels = read_val_labels(labels_file)
    images = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    unlabelled = [p.name for p in images if p.stem not in labels]
    if unlabelled:
        raise ValueError(f"{len(unlabelled)} images in {folder} have no label in {labels_file} (e.g. {unlabelled[0]})")
    for path in images:
        (folder / labels[path.stem]).mkdir(exist_ok=True)
        path.rename(folder / labels[path.stem] / path.name)
    return len(images)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m quest_image_cls.data")
    sub = parser.add_subparsers(dest="command", required=True)
    arrange = sub.add_parser("arrange-val", help="sort a flat ImageNet val/ folder into <wnid>/ class folders")
    arrange.add_argument("root", type=Path, help="the ImageNet folder holding val/")
    arrange.add_argument("labels", type=Path, help="LOC_val_solution.csv, or lines '<image file> <wnid>'")
    args = parser.parse_args()
    try:
        print(f"moved {arrange_val(args.root, args.labels)} images into {args.root / 'val'}/<wnid>/")
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
