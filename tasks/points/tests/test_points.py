"""Tests of the points task: kNN/FPS against brute force, the edge attention against a dense float64 reference,
permutation invariance, corruptions, the real-dataset layouts, and a tiny run that learns."""

import math

import numpy as np
import pytest
import torch

import quest_core
from quest_points import graph
from quest_points.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_points.data import SHIPPED, load
from quest_points.model import PointAttention, build_model


def clouds(sizes=(40, 57, 33), seed=0):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(sum(sizes), 3, generator=gen)
    return pos, torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))


@pytest.fixture(params=[False, True], ids=["fallback", "pyg-lib"])
def backend(request, monkeypatch):
    if request.param and not graph.HAS_PYG_LIB:
        pytest.skip("pyg-lib is not installed: only the pure-torch fallback runs here")
    monkeypatch.setattr(graph, "HAS_PYG_LIB", request.param)


def test_knn_equals_brute_force(backend):
    pos, batch = clouds()
    centres = torch.tensor([0, 5, 39, 40, 96, 100, 129])
    row, col = graph.knn(pos, pos[centres], 6, batch, batch[centres])
    for i, c in enumerate(centres.tolist()):
        same = (batch == batch[c]).nonzero().flatten()
        expected = same[(pos[same] - pos[c]).norm(dim=-1).argsort()[:6]]
        assert set(col[row == i].tolist()) == set(expected.tolist())


def test_knn_graph_has_no_self_loops_and_k_edges_per_point(backend):
    pos, batch = clouds()
    source, target = graph.knn_graph(pos, 5, batch)
    assert (source != target).all() and (torch.bincount(target) == 5).all()
    assert (batch[source] == batch[target]).all()
    for i in (0, 50, 129):
        others = ((batch == batch[i]) & (torch.arange(len(pos)) != i)).nonzero().flatten()
        expected = others[(pos[others] - pos[i]).norm(dim=-1).argsort()[:5]]
        assert set(source[target == i].tolist()) == set(expected.tolist())


def brute_force_fps(points: torch.Tensor, m: int) -> list[int]:
    first = int((points - points.mean(0)).norm(dim=-1).argmax())
    chosen = [first]
    for _ in range(m - 1):
        d = torch.stack([(points - points[c]).norm(dim=-1) for c in chosen]).amin(0)
        chosen.append(int(d.argmax()))
    return chosen


def test_fps_equals_brute_force(backend):
    pos, batch = clouds()
    idx = graph.fps(pos, batch, 0.25)
    start = 0
    for b, n in enumerate(torch.bincount(batch).tolist()):
        mine = idx[batch[idx] == b] - start
        assert mine.tolist() == brute_force_fps(pos[start: start + n], math.ceil(0.25 * n))
        start += n


def dense_reference(layer: PointAttention, x, pos, edge_index) -> torch.Tensor:
    """The layer's output computed densely in float64: all (i, j) pairs, non-edges masked out."""
    n, h, d = len(x), layer.num_heads, layer.head_dim
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[edge_index[1], edge_index[0]] = True  # row i attends to j for each edge j -> i
    q = layer.q(x).view(n, h, d)
    delta = layer.pos(pos[:, None, :] - pos[None, :, :]).view(n, n, h, d)  # (i, j, h, d)
    k = layer.k(x).view(1, n, h, d) + delta
    v = layer.v(x).view(1, n, h, d) + delta
    # the variant's transform (tested against float64 formulas in quest-core) on dense (H, pairs, D) tensors: what
    # this test checks is the per-edge plumbing (gathering, per-head broadcasting, softmax per target)
    q_hid, _ = layer.kernel.transform(q.transpose(0, 1), q.transpose(0, 1))
    _, k_hpd = layer.kernel.transform(k.reshape(n * n, h, d).transpose(0, 1), k.reshape(n * n, h, d).transpose(0, 1))
    q, k = q_hid.transpose(0, 1), k_hpd.transpose(0, 1).reshape(n, n, h, d)
    logits = torch.einsum("ihd,ijhd->ijh", q, k) * layer.kernel.scale()
    alpha = logits.masked_fill(~mask[..., None], -math.inf).softmax(dim=1)
    return layer.out(torch.einsum("ijh,ijhd->ihd", alpha, v).reshape(n, h * d))


@pytest.mark.parametrize("variant", quest_core.list_variants())
def test_edge_attention_equals_a_dense_masked_reference(variant):
    torch.manual_seed(0)
    layer = PointAttention(24, 4, variant).double()  # 4 heads of 6: a gain on the wrong axis cannot broadcast
    for p in layer.kernel.parameters():  # move learnable gains off their initial value
        p.data.uniform_(0.5, 2.0)
    if layer.kernel.spec.uses_metric:  # elliptical: a fixed random metric (per head and dim) instead of the estimate
        metric = torch.rand(4, 1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 0.2
        layer.kernel.metric_chain = type("FixedMetric", (), {"next_metric": lambda self, v, d, visible=None: metric})()
    pos, batch = clouds((9, 12))
    pos = pos.double()
    x = torch.randn(len(pos), 24, dtype=torch.float64, requires_grad=True)
    edge_index = graph.knn_graph(pos, 4, batch)
    out = layer(x, pos, edge_index)
    ref = dense_reference(layer, x, pos, edge_index)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g_out, = torch.autograd.grad(out.square().sum(), x)
    g_ref, = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(g_out, g_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("model_name", ["global", "local"])
def test_a_permutation_of_the_points_leaves_the_prediction_unchanged(model_name):
    torch.manual_seed(0)
    kwargs = {"groups": 8, "group_size": 8, "dim": 32, "depth": 2, "point_width": 16} if model_name == "global" else {"dims": (16, 32), "k": 8}
    model = build_model(model_name, 5, "quest", **kwargs).eval()
    pos, batch = clouds((64, 64))
    perm = torch.cat([torch.randperm(64), 64 + torch.randperm(64)])
    with torch.no_grad():
        torch.testing.assert_close(model(pos[perm], batch), model(pos, batch), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruptions_are_deterministic_and_grow_with_severity(name):
    x = torch.nn.functional.normalize(torch.randn(4, 256, 3), dim=-1) * torch.rand(4, 256, 1)
    mild, harsh = corrupt(x, name, 1, seed=3), corrupt(x, name, 5, seed=3)
    assert torch.equal(mild, corrupt(x, name, 1, seed=3)) and not torch.equal(mild, corrupt(x, name, 1, seed=4))
    if name.startswith("dropout"):
        assert x.shape[1] > mild.shape[1] > harsh.shape[1]
    elif name.startswith("add"):
        assert x.shape[1] < mild.shape[1] < harsh.shape[1]
    else:
        assert mild.shape == x.shape and (harsh - x).norm() > (mild - x).norm() > 0
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(x, name, 6)


def test_unknown_corruption_and_dataset_fail_with_the_valid_ones():
    with pytest.raises(ValueError, match="valid: jitter"):
        corrupt(torch.zeros(1, 4, 3), "fog", 1)
    with pytest.raises(ValueError, match="valid: kicad"):
        load("shapenet", None)
    with pytest.raises(ValueError, match="--data-root"):
        load("modelnet40", None)


def test_modelnet_layout_loads_through_pyg(modelnet10):  # the fixture: tasks/points/tests/conftest.py
    data = load("modelnet10", str(modelnet10), num_points=64)
    classes = sorted(p.name for p in (modelnet10 / "ModelNet10").iterdir())
    assert data.train_x.shape == (20, 64, 3) and data.test_x.shape == (10, 64, 3) and len(classes) == 10
    assert sorted(data.train_y.tolist()) == sorted(list(range(10)) * 2) and data.classes == classes
    assert data.train_x.norm(dim=-1).amax() <= 1 + 1e-5
    assert not list(modelnet10.rglob("processed"))  # the cache is outside the data root


def test_scanobjectnn_layout_loads(tmp_path):
    import h5py

    folder = tmp_path / "ScanObjectNN" / "main_split"
    folder.mkdir(parents=True)
    for split, n in (("training", 6), ("test", 3)):
        with h5py.File(folder / f"{split}_objectdataset_augmentedrot_scale75.h5", "w") as f:
            f["data"] = np.random.default_rng(0).normal(size=(n, 2048, 3)).astype(np.float32)
            f["label"] = np.arange(n, dtype=np.uint8)[:, None]
    data = load("scanobjectnn", str(tmp_path), scanobjectnn_split="_augmentedrot_scale75")
    assert data.train_x.shape == (6, 2048, 3) and data.test_y.tolist() == [0, 1, 2] and len(data.classes) == 15
    with pytest.raises(FileNotFoundError, match="training_objectdataset.h5"):
        load("scanobjectnn", str(tmp_path))


def test_the_shipped_kicad_shapes():
    data = load("kicad", None)
    assert len(data.classes) == 15 and data.train_x.shape[1:] == (1024, 3)
    assert len(data.train_x) > 3 * len(data.test_x) > 0
    assert set(data.test_y.tolist()) == set(range(15))
    assert data.train_x.norm(dim=-1).amax() <= 1.01


def test_swap_attention_converts_the_attention_inside_pyg_gpsconv():
    """GPSConv's global attention is an nn.MultiheadAttention: quest_core.swap_attention converts it in place."""
    from torch_geometric.nn import GINConv, GPSConv

    torch.manual_seed(0)
    conv = GPSConv(16, GINConv(torch.nn.Linear(16, 16)), heads=4, dropout=0.0).eval()
    pos, batch = clouds((10, 14))
    x, edge_index = torch.randn(len(pos), 16), graph.knn_graph(pos, 3, batch)
    with torch.no_grad():
        before = conv(x, edge_index, batch)
    report = quest_core.swap_attention(conv, "softmax")
    assert [path for path, _ in report.swapped] == ["attn"] and isinstance(conv.attn, quest_core.MultiheadAttention)
    with torch.no_grad():
        torch.testing.assert_close(conv(x, edge_index, batch), before, rtol=1e-5, atol=1e-6)
    quest_core.swap_attention(conv, "quest")
    with torch.no_grad():
        assert not torch.allclose(conv(x, edge_index, batch), before, atol=1e-4)


def test_knn_in_clouds_smaller_than_k_returns_every_other_point(backend):
    pos, batch = clouds((3, 10))
    source, target = graph.knn_graph(pos, 5, batch)
    assert torch.bincount(target).tolist() == [2] * 3 + [5] * 10


@pytest.mark.parametrize("model_name", ["global", "local"])
def test_a_tiny_run_learns_and_reports_robustness(tmp_path, model_name):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"model": model_name, "epochs": 4, "global_points": 256, "local_points": 128,
                 "corruption_samples": 40, "log_every": 5}
    result = execute(resolve(RunSpec("points", "quest", "tiny", 0, overrides)), tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert m["test_acc"] > 3 / 15 and m["mean_class_acc"] > 3 / 15  # chance is 1/15
    assert {f"corruption_error/{c}" for c in CORRUPTIONS} <= set(m) and 0 < m["corrupted_acc"] < 1
    assert "final_max_logit" in m and len((tmp_path / "run" / "events.jsonl").read_text().splitlines()) >= 10



def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_points.experiment import run
    from quest_points.task import PointsTask
    from quest_sdk.testing import straight_and_resumed

    # one epoch of 5 batches of 128 (695 clouds), a narrow global model on 32 points, a small corruption subset;
    # subsampling and augmentation (the step's generator) and the global RNG (none used by this model) resume.
    # The local model trains through the same loop (only the network differs): not repeated here, it is slower
    cfg = PointsTask().make_config("tiny", {"epochs": 1, "batch_size": 128, "global_points": 32, "groups": 4,
                                            "group_size": 8, "point_width": 8, "dim": 16, "depth": 1, "num_heads": 2,
                                            "corruption_samples": 8, "log_every": 1})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=3)
    assert step == 2 and resumed == straight
    assert {"test_acc", "mean_class_acc", "corrupted_acc", "final_max_logit"} <= straight.keys()
    rows = [(tmp_path / run_dir / "events.jsonl").read_text() for run_dir in ("straight", "resumed")]
    assert rows[0] == rows[1]  # the row of step 3 logged again after the resume, not doubled
