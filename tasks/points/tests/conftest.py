"""Fixtures of the points tests: a ModelNet10 tree in the official layout, and a cache folder of the test's own."""

import pytest

CUBE_OFF = "OFF\n8 6 0\n" + "".join(f"{x} {y} {z}\n" for x in (0, 1) for y in (0, 1) for z in (0, 1)) + \
    "4 0 1 3 2\n4 4 6 7 5\n4 0 4 5 1\n4 2 3 7 6\n4 0 2 6 4\n4 1 5 7 3\n"
MODELNET10 = ["bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table", "toilet"]


@pytest.fixture
def modelnet10(tmp_path, monkeypatch):
    """``<tmp>/data``: ModelNet10's layout with 2 training and 1 test cube per class; the ModelNet cache goes to
    ``<tmp>/cache``."""
    monkeypatch.setattr("quest_points.data.CACHE", tmp_path / "cache")
    for name in MODELNET10:
        for split, count in (("train", 2), ("test", 1)):
            for i in range(count):
                path = tmp_path / "data" / "ModelNet10" / name / split / f"{name}_{i:04d}.off"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(CUBE_OFF)
    return tmp_path / "data"
