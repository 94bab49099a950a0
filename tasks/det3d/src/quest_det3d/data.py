"""det3d data: a simulated nuScenes v1.0-mini (default, generated and cached) or the real nuScenes (``--data-root``),
both read through the official devkit.

- ``simulated_root`` writes ten simulated scenes under the official v1.0-mini scene names (``mini_train``: 8,
  ``mini_val``: 2; the tuning splits ``quest_train``: 7 and ``quest_tune``: 1 as the devkit's custom splits)
  into ``~/.cache/quest-bench/det3d`` (``QUEST_BENCH_CACHE`` moves it), once per setting.
- ``nuscenes_root`` finds a real nuScenes folder under the data root: ``<data-root>/nuscenes/<version>/`` or
  ``<data-root>/<version>/``, with ``samples/`` and ``sweeps/`` next to the version folder (the official layout).
- ``load_split`` reads a split's samples (clouds in memory, or read on use for large sets) through the devkit:
  ``read_cloud`` accumulates the key frame and its previous sweeps in the key frame's LiDAR frame (as the devkit's
  ``LidarPointCloud.from_file_multisweep``, but keeping each point's ring), and ``NuScenes.get_sample_data`` and
  ``box_velocity`` give the annotated boxes, with velocities, in that frame.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyquaternion import Quaternion
from tqdm.auto import tqdm

from quest_sdk.data import CACHE, build_once

SIM_VERSION = 1  # bump when the simulator or the writer changes (part of the cache folder name)
SIM_CLASSES = ("car", "truck", "pedestrian", "bicycle", "traffic_cone", "barrier")
SPLITS = {"v1.0-mini": ("mini_train", "mini_val"), "v1.0-trainval": ("train", "val")}
# Tuning splits: training scenes held out for choosing hyper-parameters (val_nds), so the reported split stays
# untouched. trainval: the devkit's own halves of train (train_detect to train, train_track to tune). The mini
# versions: one of mini_train's 8 scenes, as the devkit's custom splits ("<version>/splits.json").
TUNING_SPLITS = {"v1.0-mini": ("quest_train", "quest_tune"), "v1.0-trainval": ("train_detect", "train_track")}
MINI_TUNE_SCENES = ("scene-1100",)  # the last of mini_train's scenes


@dataclass
class Sample:
    """One key frame, in its LiDAR frame."""

    token: str
    boxes: np.ndarray  # (M, 9) float32: x, y, z, w, l, h, yaw, vx, vy (velocity NaN where the devkit has none)
    labels: np.ndarray  # (M,) int64 index into the task's classes
    lidar_to_ego: dict  # the calibrated_sensor record (translation, rotation)
    ego_to_global: dict  # the ego_pose record
    source: np.ndarray | Callable[[], np.ndarray]  # the cloud, or a function that reads it (large datasets)

    @property
    def points(self) -> np.ndarray:
        """(N, 7) float32: x, y, z, intensity, time lag (s) behind the key frame, sweep index (0 = key frame), ring."""
        return self.source() if callable(self.source) else self.source


def simulated_root(samples_per_scene: int, between: int = 1, seed: int = 0, cache: Path | None = None) -> Path:
    """The folder of a simulated v1.0-mini (``samples_per_scene`` key frames per scene, ``between`` non-key sweeps
    before each) under ``cache`` (default ``CACHE``), built on first use (parallel runs build apart, then rename)."""
    from nuscenes.utils.splits import create_splits_scenes

    from quest_det3d.nuscenes_writer import NuScenesWriter
    from quest_det3d.simulator import make_scene

    if samples_per_scene < 2:
        raise ValueError(f"a simulated scene needs at least 2 key frames (velocities), got {samples_per_scene}")
    def build(folder: Path) -> None:
        writer = NuScenesWriter(folder, "v1.0-mini")
        splits = create_splits_scenes()
        names = [*splits["mini_train"], *splits["mini_val"]]
        for i, name in enumerate(tqdm(names, desc="det3d: simulating scenes", leave=False)):
            rng = np.random.default_rng([seed, i])
            scene = make_scene(rng, duration=samples_per_scene * 0.5)
            writer.add_scene(name, scene, samples_per_scene, between, origin_xy=rng.uniform(200, 1800, 2),
                             heading=rng.uniform(-np.pi, np.pi), rng=rng, start_us=1_533_000_000_000_000 + i * 10**9)
        writer.finish()

    root = (cache or CACHE) / "det3d" / f"sim-v{SIM_VERSION}-{samples_per_scene}x{between}-seed{seed}"
    root = build_once(root, build, done="v1.0-mini/scene.json")
    write_mini_custom_splits(root)  # the tuning splits (also into folders built before they existed)
    return root


def nuscenes_root(data_root: str | Path, version: str, sweeps: int = 1) -> Path:
    """The real dataset's folder under ``data_root`` (holding ``<version>/``, ``samples/`` and, to accumulate
    ``sweeps`` > 1, ``sweeps/``), or a clear error."""
    for candidate in (Path(data_root) / "nuscenes", Path(data_root)):
        if (candidate / version / "sample.json").exists():
            for folder in ("samples", "sweeps")[: 2 if sweeps > 1 else 1]:
                if not (candidate / folder / "LIDAR_TOP").is_dir():
                    raise FileNotFoundError(f"{candidate} has {version}/ but no {folder}/LIDAR_TOP/: extract the "
                                            f"LiDAR blobs there (sweeps/ is needed to accumulate {sweeps} sweeps)")
            return candidate
    raise FileNotFoundError(
        f"no nuScenes {version} under {data_root}: expected {Path(data_root) / 'nuscenes' / version / 'sample.json'} "
        f"(the official layout: <root>/{version}/*.json, <root>/samples/LIDAR_TOP/, <root>/sweeps/LIDAR_TOP/)")


def open_nuscenes(root: Path, version: str):
    from nuscenes import NuScenes

    if version not in SPLITS:
        raise ValueError(f"unknown nuScenes version {version!r}; valid: {', '.join(SPLITS)}")
    return NuScenes(version=version, dataroot=str(root), verbose=False)


def mini_custom_splits() -> dict[str, list[str]]:
    """The mini versions' tuning splits in the devkit's custom-split format (``<version>/splits.json``)."""
    from nuscenes.utils.splits import create_splits_scenes

    train = create_splits_scenes()["mini_train"]
    return {"quest_train": [s for s in train if s not in MINI_TUNE_SCENES], "quest_tune": list(MINI_TUNE_SCENES)}


def write_mini_custom_splits(root: Path) -> None:
    """Write (atomically, once) ``root/v1.0-mini/splits.json`` with the tuning splits, for the devkit's custom
    splits: the simulated data's folder gets it; for a real nuScenes-mini copy it there to tune."""
    path = Path(root) / "v1.0-mini" / "splits.json"
    if not path.is_file():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(mini_custom_splits(), indent=1))
        tmp.replace(path)


def split_tokens(nusc, split: str) -> list[str]:
    """The sample tokens of a split (official, or custom in ``<version>/splits.json``), in scene and time order."""
    from nuscenes.utils.splits import get_scenes_of_split

    try:
        names = set(get_scenes_of_split(split, nusc))
    except ValueError as err:  # a custom split with no splits.json, or one without that split
        raise ValueError(f"{err} The tuning splits of the mini versions are custom splits: write them there with "
                         "quest_det3d.data.write_mini_custom_splits, or set tune_split to false.") from None
    tokens = []
    for scene in sorted(nusc.scene, key=lambda s: s["name"]):
        if scene["name"] in names:
            token = scene["first_sample_token"]
            while token:
                tokens.append(token)
                token = nusc.get("sample", token)["next"]
    if not tokens:
        raise ValueError(f"split {split!r} has no samples in {nusc.dataroot} ({nusc.version})")
    return tokens


def read_cloud(nusc, token: str, sweeps: int, point_range: float, min_distance: float = 1.0) -> np.ndarray:
    """A sample's key frame and up to ``sweeps - 1`` earlier sweeps in the key frame's LiDAR frame, cropped to
    |x|, |y| < ``point_range``: (N, 7) float32 x, y, z, intensity, time lag (s), sweep index (0 = key frame), ring.

    The devkit's ``LidarPointCloud.from_file_multisweep`` does the same (same transform chain, same removal of the
    points within ``min_distance`` of the sensor) but drops the laser ring, which the beam corruption needs."""
    from nuscenes.utils.geometry_utils import transform_matrix

    def pose(record, inverse):
        return transform_matrix(record["translation"], Quaternion(record["rotation"]), inverse=inverse)

    key = nusc.get("sample_data", nusc.get("sample", token)["data"]["LIDAR_TOP"])
    key_from_global = (pose(nusc.get("calibrated_sensor", key["calibrated_sensor_token"]), True)
                       @ pose(nusc.get("ego_pose", key["ego_pose_token"]), True))
    parts, record = [], key
    for index in range(sweeps):
        raw = np.fromfile(nusc.get_sample_data_path(record["token"]), np.float32).reshape(-1, 5)
        raw = raw[~((np.abs(raw[:, 0]) < min_distance) & (np.abs(raw[:, 1]) < min_distance))]
        to_key = (key_from_global @ pose(nusc.get("ego_pose", record["ego_pose_token"]), False)
                  @ pose(nusc.get("calibrated_sensor", record["calibrated_sensor_token"]), False))
        xyz = raw[:, :3] @ to_key[:3, :3].T + to_key[:3, 3]
        lag = 1e-6 * (key["timestamp"] - record["timestamp"])
        parts.append(np.column_stack([xyz, raw[:, 3], np.full(len(raw), lag), np.full(len(raw), index), raw[:, 4]]))
        if not record["prev"]:
            break
        record = nusc.get("sample_data", record["prev"])
    points = np.concatenate(parts).astype(np.float32)
    return points[(np.abs(points[:, 0]) < point_range) & (np.abs(points[:, 1]) < point_range)]


def load_split(nusc, split: str, classes: tuple[str, ...], sweeps: int, point_range: float, in_memory: bool = True,
               progress: bool = True) -> list[Sample]:
    """Every key frame of ``split`` with its boxes of ``classes`` (boxes without LiDAR points are dropped, as the
    evaluation drops them) and its accumulated cloud: read now (``in_memory``) or each time it is used (the real
    trainval: ~28k samples x 10 sweeps would not fit in memory)."""
    from nuscenes.eval.detection.utils import category_to_detection_name

    samples = []
    for token in tqdm(split_tokens(nusc, split), desc=f"det3d: reading {split}", leave=False, disable=not progress):
        record = nusc.get("sample", token)
        source = functools.partial(read_cloud, nusc, token, sweeps, point_range)
        lidar_token = record["data"]["LIDAR_TOP"]
        sd = nusc.get("sample_data", lidar_token)
        lidar_to_ego = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        ego_to_global = nusc.get("ego_pose", sd["ego_pose_token"])
        global_to_lidar = (Quaternion(lidar_to_ego["rotation"]).inverse
                           * Quaternion(ego_to_global["rotation"]).inverse).rotation_matrix
        _, boxes, _ = nusc.get_sample_data(lidar_token)
        rows, labels = [], []
        for box in boxes:
            name = category_to_detection_name(box.name)
            annotation = nusc.get("sample_annotation", box.token)
            if name not in classes or annotation["num_lidar_pts"] + annotation["num_radar_pts"] == 0:
                continue
            velocity = global_to_lidar @ nusc.box_velocity(box.token)  # get_sample_data leaves box.velocity NaN
            rows.append([*box.center, *box.wlh, box.orientation.yaw_pitch_roll[0], *velocity[:2]])
            labels.append(classes.index(name))
        samples.append(Sample(token, np.array(rows, np.float32).reshape(-1, 9), np.array(labels, np.int64),
                              lidar_to_ego, ego_to_global, source() if in_memory else source))
    return samples
