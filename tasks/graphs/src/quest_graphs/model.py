"""GraphGPS (Rampášek et al. 2022) from torch-geometric's parts, its global attention a quest-core variant.

Node input: the sum of one embedding per integer atom-feature column (width ``dim - pe_dim``) concatenated with a
linear projection (width ``pe_dim``) of the random-walk structural encoding ``pe`` (batch-normalised first with
``pe_norm``, as GraphGPS does; see ``GraphsConfig.pe_norm`` for why it is off by default); edge input:
the sum of one embedding per bond-feature column (width ``dim``), as OGB's Atom/BondEncoder and GraphGPS's
``Atom+RWSE`` encoder do. Then ``depth`` ``torch_geometric.nn.GPSConv`` layers (local ``GINEConv`` with the bond
embeddings + global multi-head attention over all atoms of the molecule, batch norm (or per-atom layer norm), MLP),
a mean (or sum) readout and GraphGPS's graph head (an MLP narrowing to dim/4).

GPSConv's attention is a ``torch.nn.MultiheadAttention``, called on the padded dense batch with
``key_padding_mask`` (``to_dense_batch``); ``quest_core.swap_attention`` converts it in place to
``quest_core.MultiheadAttention`` with the variant, which honours that mask. Every variant is swapped, softmax
included, so all of them run through the same kernel path (as the speech tasks do); the softmax swap computes what
torch's module computes (``tests/test_graphs.py``).

Written here: the per-column feature embedding (torch-geometric has none; OGB's is in the ``ogb`` package).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import GINEConv, GPSConv, global_add_pool, global_mean_pool

import quest_core

POOLS = {"mean": global_mean_pool, "add": global_add_pool}
NORMS = {"batch": {"norm": "batch_norm"}, "layer": {"norm": "layer_norm", "norm_kwargs": {"mode": "node"}}}


class FeatureEmbedding(nn.Module):
    """Integer features (N, F) -> (N, dim): the sum of one embedding table per column."""

    def __init__(self, cardinalities: tuple[int, ...], dim: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)

    def forward(self, x_nf: torch.Tensor) -> torch.Tensor:
        if x_nf.dim() != 2 or x_nf.shape[1] != len(self.tables):
            raise ValueError(f"expected integer features of shape (N, {len(self.tables)}), got {tuple(x_nf.shape)}")
        return sum(table(x_nf[:, i]) for i, table in enumerate(self.tables))


class GraphGPS(nn.Module):
    """A batch of molecules (``x``, ``pe``, ``edge_index``, ``edge_attr``, ``batch``) -> (B, out_dim)."""

    def __init__(self, atom_cardinalities: tuple[int, ...], bond_cardinalities: tuple[int, ...], out_dim: int,
                 variant: str | None, dim: int = 64, depth: int = 3, num_heads: int = 4, walk_length: int = 16,
                 pe_dim: int = 8, dropout: float = 0.0, attn_dropout: float = 0.0, pool: str = "mean",
                 norm: str = "batch", pe_norm: bool = False):
        super().__init__()
        for what, value, valid in (("pool", pool, POOLS), ("norm", norm, NORMS)):
            if value not in valid:
                raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
        self.atom_encoder = FeatureEmbedding(atom_cardinalities, dim - pe_dim)
        self.pe_norm = nn.BatchNorm1d(walk_length) if pe_norm else nn.Identity()
        self.pe_encoder = nn.Linear(walk_length, pe_dim)
        self.bond_encoder = FeatureEmbedding(bond_cardinalities, dim)
        self.layers = nn.ModuleList(
            GPSConv(dim, GINEConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))),
                    heads=num_heads, dropout=dropout, attn_type="multihead", attn_kwargs={"dropout": attn_dropout},
                    **NORMS[norm])
            for _ in range(depth))
        self.pool = POOLS[pool]
        self.head = nn.Sequential(nn.Linear(dim, dim // 2), nn.ReLU(), nn.Linear(dim // 2, dim // 4), nn.ReLU(),
                                  nn.Linear(dim // 4, out_dim))
        # None keeps torch's own attention (the reference the tests compare the softmax swap with)
        self.swap_report = None if variant is None else quest_core.swap_attention(self, variant, strict=True)

    def node_states(self, graphs: Batch) -> torch.Tensor:
        """The atoms' representations (N, dim) after the last GPS layer."""
        h_nd = torch.cat([self.atom_encoder(graphs.x), self.pe_encoder(self.pe_norm(graphs.pe))], dim=-1)
        e_ed = self.bond_encoder(graphs.edge_attr)
        for layer in self.layers:
            h_nd = layer(h_nd, graphs.edge_index, graphs.batch, edge_attr=e_ed)
        return h_nd

    def forward(self, graphs: Batch) -> torch.Tensor:
        return self.head(self.pool(self.node_states(graphs), graphs.batch))
