"""Scoring through the official devkit: detections are written as a nuScenes submission JSON (global frame) and
scored by ``nuscenes.eval.detection.evaluate.DetectionEval`` (mAP over 0.5/1/2/4 m centre distances, the TP errors
mATE/mASE/mAOE/mAVE/mAAE, and NDS)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np

META = {"use_camera": False, "use_lidar": True, "use_radar": False, "use_map": False, "use_external": False}
TP_NAMES = {"trans_err": "mATE", "scale_err": "mASE", "orient_err": "mAOE", "vel_err": "mAVE", "attr_err": "mAAE"}
MOVING_SPEED = 0.2  # m/s: above it a box gets the "moving" attribute (CenterPoint's default attribute rule, which
# never predicts vehicle.stopped: stopped traffic in the simulator, as in nuScenes, costs attribute error)


def detection_config(classes: tuple[str, ...], max_range: float):
    """The official ``detection_cvpr_2019`` config with each class's evaluation range capped at ``max_range`` (what
    the detector's BEV grid covers around the ego; the official ranges are 30-50 m, so the paper preset's 51.2 m
    grid changes nothing) and
    scored over ``classes`` only: ``DetectionConfig`` insists on ranges for all ten nuScenes classes, so the
    subset is set on ``class_names``, the list ``DetectionEval`` and ``DetectionMetrics`` iterate (with all ten,
    classes absent from the simulator would count as AP 0 and TP error 1)."""
    from nuscenes.eval.common.config import config_factory
    from nuscenes.eval.detection.data_classes import DetectionConfig

    cfg = config_factory("detection_cvpr_2019").serialize()
    unknown = set(classes) - set(cfg["class_range"])
    if unknown:
        raise ValueError(f"not nuScenes detection classes: {sorted(unknown)}; valid: {sorted(cfg['class_range'])}")
    cfg["class_range"] = {c: min(r, max_range) for c, r in cfg["class_range"].items()}
    config = DetectionConfig.deserialize(cfg)
    config.class_names = [c for c in config.class_names if c in classes]
    return config


def default_attribute(name: str, velocity_xy) -> str:
    moving = math.hypot(*velocity_xy) > MOVING_SPEED
    if name in ("car", "truck", "bus", "trailer", "construction_vehicle"):
        return "vehicle.moving" if moving else "vehicle.parked"
    if name in ("bicycle", "motorcycle"):
        return "cycle.with_rider" if moving else "cycle.without_rider"
    if name == "pedestrian":
        return "pedestrian.moving" if moving else "pedestrian.standing"
    return ""


def submission(samples, detections, classes: tuple[str, ...]) -> dict:
    """The submission dict: per sample token, each detection (LiDAR-frame rows (k, 9), scores, labels) in the
    global frame."""
    from quest_det3d.boxes import to_global

    results = {}
    for sample, (boxes, scores, labels) in zip(samples, detections, strict=True):
        rows = []
        for row, score, label in zip(np.asarray(boxes), np.asarray(scores), np.asarray(labels)):
            box = to_global(row, sample.lidar_to_ego, sample.ego_to_global)
            name = classes[int(label)]
            rows.append({"sample_token": sample.token, "translation": box.center.tolist(), "size": box.wlh.tolist(),
                         "rotation": box.orientation.elements.tolist(), "velocity": box.velocity[:2].tolist(),
                         "detection_name": name, "detection_score": float(score),
                         "attribute_name": default_attribute(name, box.velocity[:2])})
        results[sample.token] = rows
    return {"meta": META, "results": results}


def evaluate(nusc, split: str, sub: dict, config, out_dir: Path) -> dict[str, float]:
    """Write ``sub`` to ``out_dir/results_nusc.json`` and score it with ``DetectionEval``: mAP, NDS, the five TP
    errors and ``AP/<class>`` (averaged over the distance thresholds)."""
    from nuscenes.eval.detection.evaluate import DetectionEval

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results_nusc.json"
    path.write_text(json.dumps(sub))
    with contextlib.redirect_stdout(io.StringIO()):  # the devkit prints progress even when verbose=False
        metrics, _ = DetectionEval(nusc, config, str(path), split, str(out_dir), verbose=False).evaluate()
    summary = metrics.serialize()
    out = {"mAP": summary["mean_ap"], "NDS": summary["nd_score"]}
    out.update({short: summary["tp_errors"][name] for name, short in TP_NAMES.items()})
    out.update({f"AP/{c}": float(np.mean(list(aps.values()))) for c, aps in summary["label_aps"].items()})
    return out
