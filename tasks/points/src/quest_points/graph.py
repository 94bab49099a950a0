"""kNN and farthest-point sampling: torch-geometric's (pyg-lib) when installed, else a pure-torch fallback.

PyG 2.8's ``knn``, ``knn_graph`` and ``fps`` need pyg-lib, which has no wheels on PyPI; GPU machines that have it
get the fast path unchanged. The fallback works on the dense per-cloud layout (``to_dense_batch``), chunked so the
distance tensors stay under ~64 MB, and is tested against brute force.

Farthest-point sampling starts, in both paths, from the point farthest from its cloud's centroid (not from the
first or a random point), so sampling -- and so the models -- do not depend on the order of the input points.
"""

from __future__ import annotations

import math

import torch
import torch_geometric.typing
from torch_geometric.utils import to_dense_batch

HAS_PYG_LIB = bool(torch_geometric.typing.WITH_KNN and torch_geometric.typing.WITH_FPS)
_CHUNK_ELEMENTS = 1 << 24


def knn(x: torch.Tensor, y: torch.Tensor, k: int, batch_x: torch.Tensor, batch_y: torch.Tensor,
        exclude_self: bool = False) -> torch.Tensor:
    """For each point of ``y`` its ``k`` nearest points of ``x`` in the same cloud: (2, M*k) = [y index, x index].

    ``exclude_self`` (x is y) leaves each point out of its own neighbours. A cloud with fewer than k (other)
    points gives all of them, as torch-geometric's ``knn`` does.
    """
    if HAS_PYG_LIB:
        from torch_geometric.nn import knn as pyg_knn, knn_graph as pyg_knn_graph

        if exclude_self:
            source, target = pyg_knn_graph(x, k, batch_x, loop=False)
            return torch.stack([target, source])
        return pyg_knn(x, y, k, batch_x, batch_y)
    x_bnd, x_mask = to_dense_batch(x, batch_x)
    y_bmd, y_mask = to_dense_batch(y, batch_y, batch_size=x_bnd.shape[0])
    x_start = torch.cumsum(x_mask.sum(1), 0) - x_mask.sum(1)  # flat index of each cloud's first x point
    y_start = torch.cumsum(y_mask.sum(1), 0) - y_mask.sum(1)
    step = max(1, _CHUNK_ELEMENTS // max(1, x_bnd.shape[1] * y_bmd.shape[1]))
    rows, cols = [], []
    for b0 in range(0, x_bnd.shape[0], step):
        sl = slice(b0, b0 + step)
        dist = torch.cdist(y_bmd[sl], x_bnd[sl])  # (b, M, N)
        dist = dist.masked_fill(~x_mask[sl, None, :], math.inf)
        if exclude_self:
            eye = torch.eye(dist.shape[1], dist.shape[2], dtype=torch.bool, device=dist.device)
            dist = dist.masked_fill(eye, math.inf)
        d_bmk, idx_bmk = dist.topk(min(k, dist.shape[-1]), dim=-1, largest=False)
        found = torch.isfinite(d_bmk) & y_mask[sl, :, None]  # clouds with fewer than k points give fewer
        local_y = torch.arange(y_bmd.shape[1], device=x.device)[None, :, None].expand_as(idx_bmk)
        rows.append((y_start[sl, None, None] + local_y)[found])
        cols.append((x_start[sl, None, None] + idx_bmk)[found])
    return torch.stack([torch.cat(rows), torch.cat(cols)])


def knn_graph(pos: torch.Tensor, k: int, batch: torch.Tensor) -> torch.Tensor:
    """Edges (2, N*k) from each point's k nearest neighbours (source) to the point (target), no self-loops."""
    centre, neighbour = knn(pos, pos, k, batch, batch, exclude_self=True)
    return torch.stack([neighbour, centre])


def fps(pos: torch.Tensor, batch: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of ``ceil(ratio * n)`` farthest-point samples of each cloud, in sampling order, cloud by cloud."""
    pos_bnd, mask = to_dense_batch(pos, batch)
    counts = mask.sum(1)
    start_flat = torch.cumsum(counts, 0) - counts
    centroid = (pos_bnd * mask[..., None]).sum(1) / counts[:, None]
    first = ((pos_bnd - centroid[:, None]).norm(dim=-1).masked_fill(~mask, -1.0)).argmax(1)  # (B,)
    if HAS_PYG_LIB:  # pyg-lib starts from each cloud's first point: move ours to the front, then map back
        from torch_geometric.nn import fps as pyg_fps

        order = torch.arange(len(pos), device=pos.device)
        a, b = start_flat, start_flat + first
        order[a], order[b] = b, a
        return order[pyg_fps(pos[order], batch, ratio, random_start=False)]
    n_take = torch.ceil(ratio * counts.double()).long()
    m = int(n_take.max())
    chosen = torch.zeros(pos_bnd.shape[0], m, dtype=torch.long, device=pos.device)
    chosen[:, 0] = first
    nearest = torch.full(mask.shape, math.inf, device=pos.device).masked_fill(~mask, -1.0)
    rows = torch.arange(pos_bnd.shape[0], device=pos.device)
    for i in range(1, m):
        last = pos_bnd[rows, chosen[:, i - 1]]  # (B, 3)
        d = (pos_bnd - last[:, None]).square().sum(-1)
        nearest = torch.where(mask, torch.minimum(nearest, d), nearest)
        chosen[:, i] = nearest.argmax(1)
    keep = torch.arange(m, device=pos.device)[None, :] < n_take[:, None]
    return (start_flat[:, None] + chosen)[keep]
