"""Segmentation data: texture mosaics cut from real photos (default, generated) and real ADE20K (``--data-root``).

Texture mosaics: each image is a Voronoi partition into 2–5 regions, each region filled with a crop of one of ten
real photographs bundled in the scikit-image wheel; the label of a pixel is the photo it came from. Validation
crops come from a held-out strip (the right quarter) of every photo, so no validation pixel was seen in training.
They are written in ADE20K's layout (``images/{training,validation}/*.jpg``, ``annotations/.../*.png`` with
0 = ignore and classes from 1, read with ``reduce_zero_label=True``) into a cache folder, and read through
mmseg's ``ADE20KDataset`` exactly as the real ADE20K is. Generation is deterministic given the arguments.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from PIL import Image

from quest_sdk.data import CACHE, build_once, validation_split
# The ten photos bundled in the scikit-image wheel (licences in data/README.md: CC0 / public domain).
SOURCES = ("brick", "grass", "gravel", "hubble_deep_field", "immunohistochemistry", "retina", "moon", "page",
           "coffee", "chelsea")
MOSAICS_VERSION = 1  # bump when generation changes (part of the cache folder name)
SHORT_SIDE = 384  # each photo is resized so its shorter side has this many pixels
VAL_FRACTION = 0.25  # the right quarter of each photo is kept for validation crops
ADE20K_DIR = "ADEChallengeData2016"


def _source_photos() -> list[np.ndarray]:
    """The ten photos as (H, W, 3) uint8 RGB arrays, shorter side ``SHORT_SIDE``."""
    import skimage.data

    photos = []
    for name in SOURCES:
        img = getattr(skimage.data, name)()
        img = np.repeat(img[..., None], 3, axis=-1) if img.ndim == 2 else img[..., :3]
        h, w = img.shape[:2]
        scale = SHORT_SIDE / min(h, w)
        size = (round(w * scale), round(h * scale))
        photos.append(np.asarray(Image.fromarray(img).resize(size, Image.BICUBIC)))
    return photos


def _mosaic(photos: list[np.ndarray], size: int, split: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One (size, size, 3) uint8 image and its (size, size) uint8 label map (classes 1..10)."""
    n_regions = int(rng.integers(2, 6))
    classes = rng.choice(len(photos), n_regions, replace=False)
    centres = rng.uniform(0, size, (n_regions, 2))
    yy, xx = np.mgrid[0:size, 0:size]
    dist = (yy[..., None] - centres[:, 0]) ** 2 + (xx[..., None] - centres[:, 1]) ** 2
    region = dist.argmin(-1)
    image = np.zeros((size, size, 3), np.uint8)
    for r, c in enumerate(classes):
        photo = photos[c]
        h, w = photo.shape[:2]
        split_x = int(w * (1 - VAL_FRACTION))
        x_lo, x_hi = (0, split_x - size) if split == "training" else (split_x, w - size)
        y0, x0 = int(rng.integers(0, h - size + 1)), int(rng.integers(x_lo, x_hi + 1))
        crop = photo[y0: y0 + size, x0: x0 + size]
        image[region == r] = crop[region == r]
    return image, (classes[region] + 1).astype(np.uint8)


def texture_mosaics(n_train: int, n_val: int, size: int, seed: int = 0, cache: Path = CACHE) -> Path:
    """Generate (once; cached, built atomically by ``quest_sdk.data.build_once``) the mosaic dataset and return its
    root in ADE20K layout."""
    key = json.dumps({"v": MOSAICS_VERSION, "train": n_train, "val": n_val, "size": size, "seed": seed})
    root = Path(cache) / "segmentation" / f"mosaics-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if size > SHORT_SIDE * VAL_FRACTION:
        raise ValueError(f"mosaic size {size} is wider than the held-out strip ({int(SHORT_SIDE * VAL_FRACTION)} px)")

    def build(folder: Path) -> None:
        photos = _source_photos()
        for split, count in (("training", n_train), ("validation", n_val)):
            rng = np.random.default_rng([seed, 0 if split == "training" else 1])
            (folder / "images" / split).mkdir(parents=True, exist_ok=True)
            (folder / "annotations" / split).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image, label = _mosaic(photos, size, split, rng)
                Image.fromarray(image).save(folder / "images" / split / f"mosaic_{i:05d}.jpg", quality=95)
                Image.fromarray(label).save(folder / "annotations" / split / f"mosaic_{i:05d}.png")
        (folder / "done.json").write_text(key)

    return build_once(root, build, "done.json")


def tuning_split(root: Path, fraction: float, out_dir: Path) -> tuple[Path, Path] | None:
    """Hold out a fixed ``fraction`` of ``root``'s training images (the same for every run: ``SPLIT_SEED``, not the
    run's seed) for choosing hyper-parameters, as mmseg ``ann_file`` lists (image names without suffix):
    ``out_dir/{train,tune}.txt``. Returns their paths, or None for ``fraction`` 0 (train on every image). Mosaics
    and ADE20K alike have no split for this: their validation split is the one the task reports."""
    if not fraction:
        return None
    names = sorted(p.stem for p in (Path(root) / "images" / "training").glob("*.jpg"))
    if len(names) < 2:
        raise ValueError(f"cannot hold out {fraction:g} of {len(names)} training images under {root}")
    train_idx, tune_idx = validation_split(np.zeros(len(names)), fraction)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.txt", out_dir / "tune.txt"
    for path, idx in zip(paths, (train_idx, tune_idx)):
        path.write_text("".join(f"{names[i]}\n" for i in idx.tolist()))
    return paths


def ade20k_root(data_root: str | Path) -> Path:
    """The ADE20K folder under a data root (``<root>/ADEChallengeData2016`` or the root itself), checked."""
    root = Path(data_root)
    for candidate in (root / ADE20K_DIR, root / "ade" / ADE20K_DIR, root):
        if (candidate / "images" / "validation").is_dir() and (candidate / "annotations" / "validation").is_dir():
            return candidate
    raise FileNotFoundError(
        f"no ADE20K under {root}: expected {ADE20K_DIR}/images/{{training,validation}}/*.jpg and "
        f"{ADE20K_DIR}/annotations/{{training,validation}}/*.png (the official ADEChallengeData2016.zip, unzipped)"
    )
