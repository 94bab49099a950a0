"""quest-bench task det3d: LiDAR 3D object detection on nuScenes-format data (see quest_det3d.task)."""
