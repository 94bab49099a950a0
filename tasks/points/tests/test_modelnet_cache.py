"""PyG's ModelNet cache is built once per node, atomically: processes that load the same dataset at once (the
data-parallel workers of one run on one node) find one complete cache; an interrupted build leaves nothing behind."""

import multiprocessing

import pytest
from torch_geometric.datasets import ModelNet

from quest_points import data as D


def counting_process(log):
    """ModelNet.process, noting each call in ``log``."""
    original = ModelNet.process

    def process(self):
        with open(log, "a") as f:
            f.write(f"{self.processed_dir}\n")
        return original(self)

    return process


def load_in_child(root, log, queue):
    ModelNet.process = counting_process(log)  # in the forked child only
    data = D.load("modelnet10", str(root), num_points=64)
    queue.put((data.train_x.sum().item(), data.test_x.sum().item()))


def test_concurrent_loads_build_the_cache_once_and_read_the_same_clouds(modelnet10, tmp_path):
    log = tmp_path / "processed.log"
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    procs = [context.Process(target=load_in_child, args=(modelnet10, log, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    sums = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert len(set(sums)) == 1  # every process read the same clouds
    assert len(log.read_text().splitlines()) == 1  # one build (PyG processes both splits in one call)
    caches = sorted(p.name for p in (tmp_path / "cache" / "modelnet").iterdir())
    assert len(caches) == 2 and caches[1] == caches[0] + ".lock"  # the cache and its lock, no scratch folder
    assert (tmp_path / "cache" / "modelnet" / caches[0] / D.COMPLETE).exists()
    assert not list(modelnet10.rglob("processed"))  # nothing written into the data root


def test_an_incomplete_cache_is_rebuilt_and_a_failed_build_leaves_nothing(modelnet10, tmp_path, monkeypatch):
    folder = modelnet10 / "ModelNet10"
    built = D.modelnet_cache(folder, "10", 64)
    (built / D.COMPLETE).unlink()  # as a build interrupted before it was complete
    (built / "processed" / "training.pt").write_bytes(b"torn")
    again = D.modelnet_cache(folder, "10", 64)
    assert again == built and (again / D.COMPLETE).exists()
    assert len(ModelNet(str(again), name="10", train=True)) == 20  # readable again
    assert folder.is_dir() and len(list(folder.rglob("*.off"))) == 30  # the data behind the raw link is intact

    def broken(self):
        raise OSError("disk full")

    monkeypatch.setattr(ModelNet, "process", broken)
    with pytest.raises(OSError, match="disk full"):
        D.modelnet_cache(folder, "10", 32)
    assert sorted(p.name for p in (tmp_path / "cache" / "modelnet").iterdir() if not p.name.endswith(".lock")) \
        == [built.name]  # no scratch folder, no half-built cache
