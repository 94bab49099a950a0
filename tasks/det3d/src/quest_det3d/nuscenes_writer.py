"""Write simulated scenes as a complete nuScenes dataset (the 13 JSON tables of ``<root>/<version>/``, LiDAR files in
``samples/`` and ``sweeps/``, a map PNG), so that the official devkit loads it with ``NuScenes(version, root)``
exactly as it loads the real v1.0-mini.

Conventions follow nuScenes: boxes in the global frame, ``size`` = [w, l, h], rotations as [w, x, y, z]
quaternions, timestamps in microseconds, ``.pcd.bin`` files of float32 (x, y, z, intensity, ring). Key frames come
every 0.5 s, and ``between`` non-key sweeps evenly spaced before each key frame continue the LIDAR_TOP
``prev``/``next`` chain. The real data stores every 20 Hz turn (9 between key frames) and detectors accumulate the
last 10 (0.45 s); the default here stores one turn half-way between key frames, so that accumulating 3 sweeps
(key frame, the sweep 0.25 s before, the previous key frame) spans 0.5 s like nuScenes' 10 while the cache and the
CPU cost stay small.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from PIL import Image
from pyquaternion import Quaternion

from quest_det3d.simulator import CLASSES, SENSOR_FORWARD, SENSOR_HEIGHT, SENSOR_YAW, Scene, sweep

ATTRIBUTES = ("vehicle.moving", "vehicle.stopped", "vehicle.parked", "pedestrian.moving", "pedestrian.standing",
              "cycle.with_rider", "cycle.without_rider")
KEY_PERIOD = 0.5  # s between key frames
ANNOTATION_RANGE = 60.0  # m: objects farther from the ego than this are not annotated


def token(*parts) -> str:
    return hashlib.md5("/".join(map(str, parts)).encode()).hexdigest()


def yaw_quaternion(yaw: float) -> list[float]:
    return list(Quaternion(axis=[0, 0, 1], angle=float(yaw)).elements)


class NuScenesWriter:
    """Collects records table by table and writes them with ``finish``."""

    def __init__(self, root: Path, version: str, location: str = "quest-sim"):
        self.root, self.version = Path(root), version
        self.tables: dict[str, list[dict]] = {name: [] for name in (
            "attribute", "calibrated_sensor", "category", "ego_pose", "instance", "log", "map", "sample",
            "sample_annotation", "sample_data", "scene", "sensor", "visibility")}
        t = self.tables
        for name, (category, _, _) in CLASSES.items():
            t["category"].append({"token": token("category", category), "name": category,
                                  "description": f"simulated {name}", "index": len(t["category"])})
        for name in ATTRIBUTES:
            t["attribute"].append({"token": token("attribute", name), "name": name, "description": name})
        t["visibility"].append({"token": "4", "level": "v80-100", "description": "simulated: every box is visible"})
        t["sensor"].append({"token": token("sensor", "LIDAR_TOP"), "channel": "LIDAR_TOP", "modality": "lidar"})
        t["calibrated_sensor"].append({
            "token": token("calibrated_sensor", "LIDAR_TOP"), "sensor_token": token("sensor", "LIDAR_TOP"),
            "translation": [SENSOR_FORWARD, 0.0, SENSOR_HEIGHT], "rotation": yaw_quaternion(SENSOR_YAW),
            "camera_intrinsic": []})
        self.log_token = token("log", location)
        t["log"].append({"token": self.log_token, "logfile": location, "vehicle": "sim", "date_captured": "2026-01-01",
                         "location": location})
        (self.root / "maps").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(self.root / "maps" / "quest-sim.png")
        t["map"].append({"token": token("map", location), "log_tokens": [self.log_token],
                         "category": "semantic_prior", "filename": "maps/quest-sim.png"})

    def add_scene(self, name: str, scene: Scene, num_samples: int, between: int, origin_xy: np.ndarray,
                  heading: float, rng: np.random.Generator, start_us: int) -> None:
        """Simulate ``scene`` at ``num_samples`` key frames (with ``between`` sweeps before each) and add it,
        placed in the global frame at ``origin_xy`` with the road along ``heading``."""
        t = self.tables
        c, s = np.cos(heading), np.sin(heading)

        def to_global(xy):
            return origin_xy + np.array([c * xy[0] - s * xy[1], s * xy[0] + c * xy[1]])

        scene_token = token("scene", name)
        sample_tokens = [token(name, "sample", k) for k in range(num_samples)]
        last_annotation: dict[int, dict] = {}  # actor index -> its latest annotation (the prev/next chain)
        instances: dict[int, dict] = {}
        previous_sd: dict | None = None
        for k in range(num_samples):
            key_time = k * KEY_PERIOD
            for j in reversed(range(between + 1)):  # oldest sweep first; j == 0 is the key frame
                time = key_time - j * KEY_PERIOD / (between + 1)
                points, hit = sweep(scene, time, rng)
                sd_token = token(name, "sample_data", k, j)
                timestamp = start_us + int(round(time * 1e6))
                folder = "samples" if j == 0 else "sweeps"
                filename = f"{folder}/LIDAR_TOP/{name}__LIDAR_TOP__{timestamp}.pcd.bin"
                (self.root / filename).parent.mkdir(parents=True, exist_ok=True)
                points.tofile(self.root / filename)
                ego = to_global(scene.ego_xy(time))
                t["ego_pose"].append({"token": sd_token, "timestamp": timestamp,
                                      "translation": [ego[0], ego[1], 0.0], "rotation": yaw_quaternion(heading)})
                record = {"token": sd_token, "sample_token": sample_tokens[k], "ego_pose_token": sd_token,
                          "calibrated_sensor_token": token("calibrated_sensor", "LIDAR_TOP"), "timestamp": timestamp,
                          "fileformat": "pcd", "is_key_frame": j == 0, "height": 0, "width": 0, "filename": filename,
                          "prev": previous_sd["token"] if previous_sd else "", "next": ""}
                if previous_sd:
                    previous_sd["next"] = sd_token
                t["sample_data"].append(record)
                previous_sd = record
            t["sample"].append({"token": sample_tokens[k], "timestamp": start_us + int(round(key_time * 1e6)),
                                "prev": sample_tokens[k - 1] if k else "",
                                "next": sample_tokens[k + 1] if k + 1 < num_samples else "",
                                "scene_token": scene_token})
            # points per actor in the key frame: the loop above ends with j == 0, the key frame's sweep
            counts = np.bincount(hit[hit >= 0], minlength=len(scene.actors))
            ego = scene.ego_xy(key_time)
            for index, actor in enumerate(scene.actors):
                center = actor.center(key_time)
                if actor.detection_name is None or np.hypot(*(center[:2] - ego)) > ANNOTATION_RANGE:
                    continue
                ann_token = token(name, "annotation", k, index)
                category = CLASSES[actor.detection_name][0]
                if index not in instances:
                    instances[index] = {"token": token(name, "instance", index),
                                        "category_token": token("category", category), "nbr_annotations": 0,
                                        "first_annotation_token": ann_token, "last_annotation_token": ann_token}
                    t["instance"].append(instances[index])
                instance = instances[index]
                instance["nbr_annotations"] += 1
                instance["last_annotation_token"] = ann_token
                previous = last_annotation.get(index)
                annotation = {
                    "token": ann_token, "sample_token": sample_tokens[k], "instance_token": instance["token"],
                    "visibility_token": "4",
                    "attribute_tokens": [token("attribute", actor.attribute)] if actor.attribute else [],
                    "translation": [*to_global(center[:2]), center[2]], "size": [float(v) for v in actor.wlh],
                    "rotation": yaw_quaternion(actor.yaw + heading), "prev": previous["token"] if previous else "",
                    "next": "", "num_lidar_pts": int(counts[index]), "num_radar_pts": 0}
                if previous:
                    previous["next"] = ann_token
                t["sample_annotation"].append(annotation)
                last_annotation[index] = annotation
        t["scene"].append({"token": scene_token, "log_token": self.log_token, "nbr_samples": num_samples,
                           "first_sample_token": sample_tokens[0], "last_sample_token": sample_tokens[-1],
                           "name": name, "description": f"simulated street, ego at {scene.ego_speed:.1f} m/s"})

    def finish(self) -> None:
        folder = self.root / self.version
        folder.mkdir(parents=True, exist_ok=True)
        for name, records in self.tables.items():
            (folder / f"{name}.json").write_text(json.dumps(records))
