"""A deterministic spinning-LiDAR simulator of street scenes (hand-written: no library simulates a LiDAR in pure
numpy without a game engine).

The sensor is shaped like nuScenes' LIDAR_TOP (a Velodyne HDL-32E on the roof): 32 beams from -30.67 to +10.67
degrees elevation, 1,084 azimuth steps per turn, mounted 1.84 m above the ground and turned -90 degrees about z.
Each ray is cast against the ground plane and against oriented boxes (the labelled objects and unlabelled clutter:
buildings, poles, trunks and bins) and stops at the nearest hit (occlusion), with range noise, random dropout and an
intensity that depends on the material and falls with range. Objects have nuScenes' mean class sizes (jittered),
move at constant velocity in lanes and on sidewalks, and are seen by every sweep at that sweep's time, so moving
objects smear across the sweeps a detector accumulates. Cars and trucks are two boxes each (bonnet and cabin,
cab and cargo box) inside their annotated box, so their front is visible.

Scenes are built in a road frame (x along the road); ``quest_det3d.nuscenes_writer`` places each scene in the
global frame and writes the whole thing as a nuScenes dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Detection class -> (nuScenes category, mean size [w, l, h] in m, reflectivity 0..1)
CLASSES = {
    "car": ("vehicle.car", (1.95, 4.62, 1.73), 0.6),
    "truck": ("vehicle.truck", (2.51, 6.93, 2.84), 0.5),
    "pedestrian": ("human.pedestrian.adult", (0.67, 0.73, 1.77), 0.3),
    "bicycle": ("vehicle.bicycle", (0.60, 1.70, 1.28), 0.4),
    "traffic_cone": ("movable_object.trafficcone", (0.41, 0.41, 1.07), 0.9),
    "barrier": ("movable_object.barrier", (2.49, 0.50, 0.98), 0.8),
}
ELEVATIONS_DEG = np.linspace(-30.67, 10.67, 32)
AZIMUTH_STEPS = 1084
SENSOR_HEIGHT = 1.84  # m above the ground
SENSOR_FORWARD = 0.94  # m ahead of the ego origin (the rear axle)
SENSOR_YAW = -np.pi / 2  # LIDAR_TOP's x axis points to the right of the car
MAX_RANGE = 70.0
RANGE_NOISE = 0.02  # m, Gaussian along the ray
DROPOUT = 0.05  # fraction of returns lost at random
# Vehicles are not plain boxes, so that their heading has a visible front: parts as (offset of the part's centre
# along the length axis, length, height), each a fraction of the annotated box; the part spans the full width.
PARTS = {
    "car": ((0.0, 1.0, 0.55), (-0.1, 0.55, 1.0)),  # body up to the bonnet, cabin set back
    "truck": ((0.36, 0.28, 0.85), (-0.14, 0.72, 1.0)),  # cab in front, taller cargo box behind
}


@dataclass
class Actor:
    """One box in a scene, in the road frame at time 0; ``detection_name`` is None for unlabelled clutter."""

    detection_name: str | None
    wlh: np.ndarray  # (3,) width, length, height
    xy: np.ndarray  # (2,) centre at t = 0
    yaw: float  # heading of the length axis
    velocity: np.ndarray  # (2,) m/s
    attribute: str = ""
    reflectivity: float = 0.5

    def center(self, t: float) -> np.ndarray:
        xy = self.xy + self.velocity * t
        return np.array([xy[0], xy[1], self.wlh[2] / 2])

    def parts(self, t: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (centre, wlh) of each solid part at time ``t`` (one part for most classes)."""
        center = self.center(t)
        out = []
        for offset, length, height in PARTS.get(self.detection_name, ((0.0, 1.0, 1.0),)):
            shift = offset * self.wlh[1] * np.array([np.cos(self.yaw), np.sin(self.yaw)])
            wlh = self.wlh * np.array([1.0, length, height])
            out.append((np.array([center[0] + shift[0], center[1] + shift[1], wlh[2] / 2]), wlh))
        return out


@dataclass
class Scene:
    actors: list[Actor]
    ego_speed: float  # m/s along +x of the road frame, from x = 0 at t = 0
    duration: float  # s

    def ego_xy(self, t: float) -> np.ndarray:
        return np.array([self.ego_speed * t, -1.75])


def make_scene(rng: np.random.Generator, duration: float) -> Scene:
    """A street: a 4-lane road (|y| < 7), parking lanes, sidewalks (9 < |y| < 13) and buildings (|y| > 14).

    Static things cover the ego's path +-60 m; a stream moving at ``v`` m/s along x is placed over the stretch that
    keeps it around the ego for the whole scene (faster than the ego: starting further behind; slower or oncoming:
    further ahead)."""
    ego_speed = 0.0 if rng.random() < 0.2 else rng.uniform(3, 10)
    x0, x1 = -60.0, ego_speed * duration + 60.0
    actors: list[Actor] = []

    def span(v: float) -> tuple[float, float]:
        return x0 - max(0.0, v - ego_speed) * duration, x1 + max(0.0, ego_speed - v) * duration

    def add(name, xy, yaw, velocity=(0.0, 0.0), attribute=""):
        base = np.array(CLASSES[name][1])
        wlh = base * rng.uniform(0.9, 1.1, 3)
        actors.append(Actor(name, wlh, np.asarray(xy, float), yaw, np.asarray(velocity, float), attribute,
                            CLASSES[name][2] * rng.uniform(0.8, 1.2)))

    for lane_y, direction in ((-5.25, 1), (-1.75, 1), (1.75, -1), (5.25, -1)):  # traffic lanes
        ego_lane = lane_y == -1.75
        speed = ego_speed if ego_lane else (0.0 if rng.random() < 0.15 else rng.uniform(3, 12))
        lo, hi = span(direction * speed)
        x = lo + rng.uniform(0, 15)
        while x < hi:
            name = "truck" if rng.random() < 0.15 else "car"
            if not (ego_lane and abs(x) < 10):
                v = 0.0 if speed == 0 else speed + rng.uniform(-0.2, 0.2)
                attribute = "vehicle.moving" if v > 0 else "vehicle.stopped"
                add(name, (x, lane_y), 0.0 if direction > 0 else np.pi, (direction * v, 0.0), attribute)
            x += rng.uniform(12, 30)
    zone_sides = (rng.choice([-1, 1]),) if rng.random() < 0.5 else (-1, 1)  # every scene has construction
    for side in (-1, 1):
        # a construction zone in the parking lane, somewhere along the ego's path
        zone = rng.uniform(x0 + 30, x1 - 55) if side in zone_sides else None
        x = x0 + rng.uniform(0, 5)
        while x < x1:
            if zone is not None and zone <= x < zone + 25:
                for k in range(8):
                    add("traffic_cone", (x + 3 * k, side * 7.3), rng.uniform(-np.pi, np.pi))
                for k in range(8):
                    add("barrier", (x + 3 * k + 1.5, side * 8.4), np.pi / 2 + rng.normal(0, 0.05))
                x += 26
                continue
            if rng.random() < 0.7:
                add("car", (x, side * 7.9), rng.choice([0.0, np.pi]) + rng.normal(0, 0.03), attribute="vehicle.parked")
            x += rng.uniform(5.5, 9)
        for _ in range(rng.poisson((x1 - x0) / 10)):  # pedestrians on the sidewalk
            y = side * rng.uniform(10.6, 12.2)
            if rng.random() < 0.7:
                v = rng.choice([-1, 1]) * rng.uniform(0.8, 1.6)
                lo, hi = span(v)
                add("pedestrian", (lo + (hi - lo) * rng.random(), y), 0.0 if v > 0 else np.pi, (v, 0.0),
                    "pedestrian.moving")
            else:
                add("pedestrian", (rng.uniform(x0, x1), y), rng.uniform(-np.pi, np.pi), attribute="pedestrian.standing")
        v = -side * rng.uniform(3, 6)  # cyclists at the lane edge, with the traffic on their side
        lo, hi = span(v)
        for _ in range(rng.poisson((hi - lo) / 60)):
            add("bicycle", (rng.uniform(lo, hi), side * 6.7), 0.0 if v > 0 else np.pi,
                (v + rng.uniform(-0.3, 0.3), 0.0), "cycle.with_rider")
        for _ in range(rng.poisson((x1 - x0) / 60)):  # parked along the sidewalk
            add("bicycle", (rng.uniform(x0, x1), side * 9.9), rng.choice([0.0, np.pi]), attribute="cycle.without_rider")
        clutter(actors, rng, side, x0, x1)
    return Scene(actors, ego_speed, duration)


def clutter(actors: list[Actor], rng: np.random.Generator, side: int, x0: float, x1: float) -> None:
    """Unlabelled boxes: building blocks with gaps, poles and tree trunks at the kerb, bins on the sidewalk."""
    x = x0 - 20
    while x < x1 + 20:
        length = rng.uniform(8, 30)
        if rng.random() < 0.8:
            depth, height = rng.uniform(6, 12), rng.uniform(4, 15)
            actors.append(Actor(None, np.array([depth, length, height]), np.array([x + length / 2, side * (14 + depth / 2)]),
                                0.0, np.zeros(2), reflectivity=rng.uniform(0.2, 0.7)))
        x += length + rng.uniform(0, 6)
    for size, spacing, y in (((0.25, 0.25, 6.0), 18, 9.0), ((0.5, 0.5, 3.0), 14, 9.0), ((0.6, 0.6, 1.1), 25, 12.9)):
        x = x0 + rng.uniform(0, spacing)
        while x < x1:
            actors.append(Actor(None, np.array(size), np.array([x, side * y]), rng.uniform(0, np.pi), np.zeros(2),
                                reflectivity=rng.uniform(0.3, 0.8)))
            x += rng.uniform(0.6, 1.4) * spacing


def sensor_pose(scene: Scene, t: float) -> tuple[np.ndarray, float]:
    """The sensor's origin (3,) and yaw in the road frame at time ``t``."""
    xy = scene.ego_xy(t) + np.array([SENSOR_FORWARD, 0.0])
    return np.array([xy[0], xy[1], SENSOR_HEIGHT]), SENSOR_YAW


def sweep(scene: Scene, t: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One sensor turn at time ``t``: points (N, 5) = x, y, z, intensity (0..255), ring in the sensor frame, and the
    index into ``scene.actors`` each point hit (-1 for the ground)."""
    origin, yaw = sensor_pose(scene, t)
    elevation = np.deg2rad(ELEVATIONS_DEG)[:, None]
    azimuth = np.arange(AZIMUTH_STEPS) * (2 * np.pi / AZIMUTH_STEPS)
    dirs_s = np.stack(np.broadcast_arrays(np.cos(elevation) * np.cos(azimuth), np.cos(elevation) * np.sin(azimuth),
                                          np.sin(elevation)), -1)  # (32, A, 3) in the sensor frame
    c, s = np.cos(yaw), np.sin(yaw)
    dirs_w = np.stack([c * dirs_s[..., 0] - s * dirs_s[..., 1], s * dirs_s[..., 0] + c * dirs_s[..., 1],
                       dirs_s[..., 2]], -1)
    depth = np.full(dirs_s.shape[:2], np.inf)
    hit = np.full(dirs_s.shape[:2], -1)
    down = dirs_w[..., 2] < 0
    depth[down] = origin[2] / -dirs_w[down][:, 2]
    for index, actor in enumerate(scene.actors):
        cols = _azimuth_columns(actor, t, origin, yaw)
        if cols is None:
            continue
        t_hit = np.min([_ray_box(origin, dirs_w[:, cols], center, wlh, actor.yaw) for center, wlh in actor.parts(t)], 0)
        closer = t_hit < depth[:, cols]
        depth[:, cols] = np.where(closer, t_hit, depth[:, cols])
        hit[:, cols] = np.where(closer, index, hit[:, cols])

    keep = (depth < MAX_RANGE) & (rng.random(depth.shape) > DROPOUT)
    r = depth[keep] + rng.normal(0, RANGE_NOISE, keep.sum())
    xyz = dirs_s[keep] * r[:, None]
    index = hit[keep]
    reflectivity = np.array([a.reflectivity for a in scene.actors] + [0.15])[index]  # index -1: the ground
    intensity = np.clip(255 * reflectivity * (1 - r / (1.5 * MAX_RANGE)) + rng.normal(0, 3, r.shape), 0, 255)
    ring = np.broadcast_to(np.arange(len(ELEVATIONS_DEG))[:, None], depth.shape)[keep]
    points = np.column_stack([xyz, intensity, ring]).astype(np.float32)
    return points, index


def _azimuth_columns(actor: Actor, t: float, origin: np.ndarray, sensor_yaw: float) -> np.ndarray | None:
    """The azimuth columns whose rays can reach ``actor`` (None if it is out of range)."""
    center = actor.center(t)
    rel = center[:2] - origin[:2]
    dist = np.hypot(*rel)
    radius = 0.5 * np.hypot(actor.wlh[0], actor.wlh[1])
    if dist - radius > MAX_RANGE:
        return None
    if dist <= radius + 0.5:
        return np.arange(AZIMUTH_STEPS)
    mid = np.arctan2(rel[1], rel[0]) - sensor_yaw
    half = np.arcsin(min(1.0, radius / dist))
    step = 2 * np.pi / AZIMUTH_STEPS
    lo, hi = int(np.floor((mid - half) / step)), int(np.ceil((mid + half) / step))
    return np.arange(lo, hi + 1) % AZIMUTH_STEPS


def _ray_box(origin: np.ndarray, dirs: np.ndarray, center: np.ndarray, wlh: np.ndarray, yaw: float) -> np.ndarray:
    """Distance along each ray (..., 3) from ``origin`` to a box rotated by ``yaw`` about z (inf where it misses):
    the slab method in the box's frame, whose x axis is the length axis."""
    c, s = np.cos(yaw), np.sin(yaw)
    rel = origin - center
    o = np.array([c * rel[0] + s * rel[1], -s * rel[0] + c * rel[1], rel[2]])
    d = np.stack([c * dirs[..., 0] + s * dirs[..., 1], -s * dirs[..., 0] + c * dirs[..., 1], dirs[..., 2]], -1)
    half = np.array([wlh[1], wlh[0], wlh[2]]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (-half - o) / d, (half - o) / d
    t_near = np.nanmax(np.minimum(t1, t2), -1)
    t_far = np.nanmin(np.maximum(t1, t2), -1)
    return np.where((t_far >= t_near) & (t_near > 0), t_near, np.inf)
