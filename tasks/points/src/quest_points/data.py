"""Point-cloud datasets as dense tensors: clouds (N, P, 3) in the unit sphere, labels (N,), class names.

- ``kicad`` (default, shipped): real CAD models of electronic parts from KiCad's 3D library, 15 classes, 1,024
  surface points each (``scripts/build_kicad_shapes.py``; licence in data/README.md).
- ``modelnet10`` / ``modelnet40`` from ``--data-root``: the official Princeton ``.off`` layout
  (``ModelNet40/<class>/{train,test}/*.off``), read by ``torch_geometric.datasets.ModelNet`` (no download) with
  ``SamplePoints`` area-weighted sampling; PyG's processed cache goes to ``~/.cache/quest-bench/modelnet``, never
  into the data root, and is built once per node (``modelnet_cache``: under a file lock, in a scratch folder renamed
  into place when complete), so data-parallel workers on one node never race on it.
- ``scanobjectnn`` from ``--data-root``: the h5 files of ScanObjectNN (``ScanObjectNN/main_split/
  {training,test}_objectdataset[_augmentedrot_scale75].h5`` with ``data`` (N, 2048, 3) and ``label``); the variant
  is chosen with ``scanobjectnn_split`` (``""`` = OBJ_ONLY, ``"_augmentedrot_scale75"`` = PB_T50_RS).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quest_sdk.data import CACHE, build_once, require_data_root

SHIPPED = Path(__file__).parent / "data" / "kicad15.npz"
DATASETS = ("kicad", "modelnet10", "modelnet40", "scanobjectnn")


@dataclass
class PointClouds:
    train_x: torch.Tensor  # (N, P, 3) float32
    train_y: torch.Tensor  # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[str]
    revision: str  # content hash or source folder


def normalize(x_np3: torch.Tensor) -> torch.Tensor:
    """Centre each cloud and scale it into the unit sphere."""
    x_np3 = x_np3 - x_np3.mean(1, keepdim=True)
    return x_np3 / x_np3.norm(dim=-1).amax(1).clamp_min(1e-9)[:, None, None]


def load(dataset: str, data_root: str | None, num_points: int = 1024, scanobjectnn_split: str = "") -> PointClouds:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    if dataset == "kicad":
        return load_kicad()
    root = require_data_root(data_root, dataset)
    if dataset.startswith("modelnet"):
        return load_modelnet(root, dataset[len("modelnet"):], num_points)
    return load_scanobjectnn(root, scanobjectnn_split)


def load_kicad(path: Path = SHIPPED) -> PointClouds:
    with np.load(path) as z:
        x = torch.from_numpy(z["points"].astype(np.float32))
        y, split = torch.from_numpy(z["labels"].astype(np.int64)), torch.from_numpy(z["split"])
        classes = [str(c) for c in z["classes"]]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    train, test = split == 0, split == 1
    return PointClouds(x[train], y[train], x[test], y[test], classes, f"{path.name} sha256:{digest}")


def load_modelnet(root: Path, name: str, num_points: int) -> PointClouds:
    """ModelNet10/40 from the official layout through PyG's ModelNet dataset (its raw folder is linked, not copied)."""
    from torch_geometric.datasets import ModelNet
    from torch_geometric.transforms import SamplePoints

    folder = root / f"ModelNet{name}"
    if not folder.is_dir():
        raise FileNotFoundError(f"no {folder}; expected the official layout {folder}/<class>/{{train,test}}/*.off")
    pyg_root = modelnet_cache(folder, name, num_points)
    splits = {}
    for train in (True, False):  # reads the processed files (the cache is complete)
        ds = ModelNet(str(pyg_root), name=name, train=train, pre_transform=SamplePoints(num_points))
        x = torch.stack([d.pos for d in ds]) if len(ds) else torch.zeros(0, num_points, 3)
        splits[train] = (normalize(x), torch.cat([d.y for d in ds]) if len(ds) else torch.zeros(0, dtype=torch.long))
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return PointClouds(*splits[True], *splits[False], classes, str(folder))


COMPLETE = "complete"  # written last into a ModelNet cache folder before it is renamed into place


def modelnet_cache(folder: Path, name: str, num_points: int) -> Path:
    """PyG's processed ModelNet cache of ``folder`` (both splits), built once per node: the first process takes a
    file lock and builds it atomically (``quest_sdk.data.build_once``: a scratch folder renamed into place with a
    completion marker; an incomplete folder is rebuilt); the others wait for the lock and find it done."""
    from filelock import FileLock  # a dependency of torch
    from torch_geometric.datasets import ModelNet
    from torch_geometric.transforms import SamplePoints

    def build(scratch: Path) -> None:
        (scratch / "raw").symlink_to(folder.resolve(), target_is_directory=True)  # linked, not copied
        for train in (True, False):
            with torch.random.fork_rng():  # SamplePoints draws from the global generator (once per cache):
                torch.manual_seed(0)       # seed it without touching the run's own random state
                ModelNet(str(scratch), name=name, train=train, pre_transform=SamplePoints(num_points))
        (scratch / COMPLETE).touch()

    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]
    final = CACHE / "modelnet" / f"ModelNet{name}-{digest}-{num_points}"
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{final}.lock"):
        return build_once(final, build, COMPLETE)


def load_scanobjectnn(root: Path, variant: str) -> PointClouds:
    import h5py

    folder = root / "ScanObjectNN" / "main_split"
    out = []
    for split in ("training", "test"):
        path = folder / f"{split}_objectdataset{variant}.h5"
        if not path.exists():
            raise FileNotFoundError(f"no {path}; expected ScanObjectNN's h5 layout {folder}/"
                                    f"{{training,test}}_objectdataset{variant}.h5")
        with h5py.File(path, "r") as f:
            out += [normalize(torch.from_numpy(np.asarray(f["data"], dtype=np.float32))),
                    torch.from_numpy(np.asarray(f["label"]).astype(np.int64).reshape(-1))]
    classes = SCANOBJECTNN_CLASSES
    return PointClouds(*out, classes, str(folder))


SCANOBJECTNN_CLASSES = ["bag", "bin", "box", "cabinet", "chair", "desk", "display", "door", "shelf", "table", "bed",
                        "pillow", "sink", "sofa", "toilet"]


# torch_geometric.datasets.ModelNet downloads ModelNet10.zip unless its raw folder holds these (for ModelNet40 too)
PYG_MODELNET_RAW = ("bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table", "toilet")


def layout(dataset: str, scanobjectnn_split: str = "") -> str:
    """The files a dataset read from --data-root needs, relative to it."""
    if dataset.startswith("modelnet"):
        name = f"ModelNet{dataset[len('modelnet'):]}"
        return f"{name}/<class>/{{train,test}}/<class>_NNNN.off (Princeton's {name}.zip, unzipped there as it is)"
    return f"ScanObjectNN/main_split/{{training,test}}_objectdataset{scanobjectnn_split}.h5"


def check_root(dataset: str, root: Path, scanobjectnn_split: str = "") -> None:
    """A ``ValueError`` naming the expected layout when ``root`` does not hold ``dataset`` (names only: nothing is
    read or downloaded)."""
    expected = f"expected under {root}: {layout(dataset, scanobjectnn_split)}"
    if dataset == "scanobjectnn":
        folder = root / "ScanObjectNN" / "main_split"
        missing = [p.name for p in (folder / f"{s}_objectdataset{scanobjectnn_split}.h5" for s in ("training", "test"))
                   if not p.is_file()]
        if missing:
            raise ValueError(f"scanobjectnn: no {', '.join(missing)} in {folder}; {expected}")
        return
    folder = root / f"ModelNet{dataset[len('modelnet'):]}"
    if not folder.is_dir():
        raise ValueError(f"{dataset}: no folder {folder}; {expected}")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    strays = [c for c in classes if c.startswith(("_", "."))]
    if strays:
        raise ValueError(f"{dataset}: {folder} holds {', '.join(strays)}, which is not a class (macOS zip metadata?): "
                         f"remove it; {expected}")
    missing = [c for c in PYG_MODELNET_RAW if c not in classes]
    if missing:
        raise ValueError(f"{dataset}: no class folder(s) {', '.join(missing)} in {folder}; {expected}")
    for cls in classes:
        for split in ("train", "test"):
            if not next((folder / cls / split).glob(f"{cls}_*.off"), None):
                found = sorted(p.name for p in (folder / cls / split).glob("*"))[:2] if (folder / cls / split).is_dir() \
                    else []
                raise ValueError(f"{dataset}: no {cls}_NNNN.off in {folder / cls / split}"
                                 + (f" (found e.g. {', '.join(found)})" if found else "") + f"; {expected}")
