"""Corruptions of molecular graphs, 5 severities each (the fraction ``p`` = 0.05, 0.1, 0.2, 0.3, 0.5):

    edge_drop      each bond (both directions together) is removed with probability p
    feature_noise  each atom-feature entry is, with probability p, replaced by another value of its column drawn
                   uniformly from the values that column takes in the training set (the features are categories:
                   element, degree, charge, aromaticity, ...; a column with a single training value stays as it is)
    added_edges    floor(p · bonds + v) new bonds (v ~ U(0, 1) per graph: p · bonds on average) between atoms of
                   the molecule that were not bonded, each with a bond-feature row drawn from the training set's rows
                   by their frequency

For a given seed the draws do not depend on the severity, so a harsher severity corrupts a superset of what a
milder one did (nested corruptions: the curve over severities measures the model, not the dice). Deterministic
given ``seed``. The corrupted copies carry no ``pe``: structural encodings are recomputed on what the model sees
(``quest_graphs.data.with_random_walk_pe``).

Written here: torch-geometric's ``dropout_edge`` / ``add_random_edge`` draw from the global generator, give added
edges no features and cannot nest severities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch_geometric.data import Data

from quest_sdk.robustness import check_corruption

SEVERITIES = (1, 2, 3, 4, 5)
FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.5)
CORRUPTIONS = ("edge_drop", "feature_noise", "added_edges")


@dataclass(frozen=True)
class Vocabulary:
    """The feature values of the training graphs that corruptions draw from."""

    atom_values: tuple[torch.Tensor, ...]  # per column of x: its sorted distinct values
    bond_rows: torch.Tensor  # (R, F_e) the distinct rows of edge_attr
    bond_counts: torch.Tensor  # (R,) how often each occurs

    @classmethod
    def of(cls, graphs: list[Data]) -> "Vocabulary":
        x_nf = torch.cat([g.x for g in graphs])
        edge_attr_ef = torch.cat([g.edge_attr for g in graphs])
        rows, counts = torch.unique(edge_attr_ef, dim=0, return_counts=True)
        return cls(tuple(torch.unique(x_nf[:, c]) for c in range(x_nf.shape[1])), rows, counts)


def corrupt(graphs: list[Data], name: str, severity: int, vocab: Vocabulary, seed: int = 0) -> list[Data]:
    """Corrupted copies of ``graphs`` (without ``pe``)."""
    check_corruption(name, severity, CORRUPTIONS, SEVERITIES)
    gen = torch.Generator().manual_seed(seed)
    p = FRACTIONS[severity - 1]
    return [_FUNCTIONS[name](_without_pe(g), p, vocab, gen) for g in graphs]


def _without_pe(graph: Data) -> Data:
    out = graph.clone()
    if "pe" in out:
        del out.pe
    return out


def _bond_ids(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each bond's key i * N + j (i < j), and for each directed edge the index of its bond."""
    low, high = edge_index.min(0).values, edge_index.max(0).values
    return torch.unique(low * num_nodes + high, return_inverse=True)


def _edge_drop(g: Data, p: float, vocab: Vocabulary, gen: torch.Generator) -> Data:
    bonds, bond_of_edge = _bond_ids(g.edge_index, g.num_nodes)
    u_bond = torch.rand(len(bonds), generator=gen)
    keep = u_bond[bond_of_edge] >= p
    g.edge_index, g.edge_attr = g.edge_index[:, keep], g.edge_attr[keep]
    return g


def _feature_noise(g: Data, p: float, vocab: Vocabulary, gen: torch.Generator) -> Data:
    u_nf, w_nf = torch.rand(g.x.shape, generator=gen), torch.rand(g.x.shape, generator=gen)
    x_nf = g.x.clone()
    for c, values in enumerate(vocab.atom_values):
        if len(values) < 2:
            continue
        current = x_nf[:, c].contiguous()
        pos = torch.searchsorted(values, current).clamp(max=len(values) - 1)
        present = values[pos] == current
        choices = len(values) - present.long()  # the other values: skip the current one if it is a training value
        r = (w_nf[:, c] * choices).long().clamp(max=len(values) - 1)
        r = r + (present & (r >= pos)).long()
        change = u_nf[:, c] < p
        x_nf[change, c] = values[r[change]]
    g.x = x_nf
    return g


def _added_edges(g: Data, p: float, vocab: Vocabulary, gen: torch.Generator) -> Data:
    n = g.num_nodes
    bonds, _ = _bond_ids(g.edge_index, n)
    pairs = torch.triu_indices(n, n, offset=1)
    candidates = pairs[:, ~torch.isin(pairs[0] * n + pairs[1], bonds)]
    score = torch.rand(candidates.shape[1], generator=gen)
    rows = (torch.multinomial(vocab.bond_counts.float(), candidates.shape[1], replacement=True, generator=gen)
            if candidates.shape[1] else torch.zeros(0, dtype=torch.long))
    v = float(torch.rand((), generator=gen))
    count = min(candidates.shape[1], math.floor(p * len(bonds) + v))
    chosen = score.argsort()[:count]
    new_2k, attr_kf = candidates[:, chosen], vocab.bond_rows[rows[chosen]].to(g.edge_attr.dtype)
    g.edge_index = torch.cat([g.edge_index, new_2k, new_2k.flip(0)], dim=1)
    g.edge_attr = torch.cat([g.edge_attr, attr_kf, attr_kf])
    return g


_FUNCTIONS = {"edge_drop": _edge_drop, "feature_noise": _feature_noise, "added_edges": _added_edges}
