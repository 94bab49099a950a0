"""Point-cloud classifiers whose attention is a quest-core variant.

- ``LocalPointTransformer`` (``model=local``): hierarchical; each stage is multi-head *dot-product* attention over a
  kNN graph (``PointAttention``, a torch-geometric ``MessagePassing`` layer in the ``TransformerConv`` form
  softmax_j(q_i · k_ij · scale) with a learned relative-position term δ_ij = MLP(p_i − p_j) added to keys and
  values, as in Point Transformer), then farthest-point sampling + kNN max-pooling down to the next stage.
- ``GlobalPointTransformer`` (``model=global``): the Point-BERT / Point-MAE backbone: FPS centres, kNN groups, a
  small PointNet per group as the token embedding, an MLP of the centre as position embedding, a CLS token, and a
  pre-norm transformer encoder built from ``quest_core.SelfAttention``.

Both take ``pos`` (N, 3) and ``batch`` (N,) of a torch-geometric ``Batch`` and return (B, classes) logits. The
variant enters the local layer through the same ``AttentionKernel`` the dense models use (its transform of q and k,
its learnable gains, its scale and its telemetry slot), applied per edge instead of per (query, key) pair.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import scatter, softmax, to_dense_batch

from quest_core import AttentionKernel, SelfAttention
from quest_points.graph import fps, knn, knn_graph


class PointAttention(MessagePassing):
    """Multi-head dot-product attention of each point over its graph neighbours (edges j -> i).

    out_i = W_o Σ_j softmax_j(scale · q̂_i · k̂_ij) (v_j + δ_ij),  k_ij = W_k x_j + δ_ij,  δ_ij = MLP(p_i − p_j),
    where ^ is the variant's transform (QUEST: k normalised per head, scale 1; softmax: none, scale 1/sqrt(D)).
    """

    def __init__(self, dim: int, num_heads: int, variant: str, pos_hidden: int = 32):
        super().__init__(aggr="add", node_dim=0)
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.pos = nn.Sequential(nn.Linear(3, pos_hidden), nn.GELU(), nn.Linear(pos_hidden, dim))
        self.kernel = AttentionKernel(variant, num_heads, self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x_nc: torch.Tensor, pos_n3: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h, d = self.num_heads, self.head_dim
        v_nhd = self.v(x_nc).view(-1, h, d)
        self.kernel.update_metric(v_nhd.transpose(0, 1))  # elliptical variants: this layer's metric (else a no-op)
        out_nhd = self.propagate(edge_index, q=self.q(x_nc).view(-1, h, d), k=self.k(x_nc).view(-1, h, d),
                                 v=v_nhd, pos=pos_n3)
        return self.out(out_nhd.flatten(1))

    def message(self, q_i, k_j, v_j, pos_i, pos_j, index, ptr, size_i):
        delta_ehd = self.pos(pos_i - pos_j).view(-1, self.num_heads, self.head_dim)
        k_ehd = k_j + delta_ehd
        q_hed, k_hed = self.kernel.transform(q_i.transpose(0, 1), k_ehd.transpose(0, 1))  # (H, E, D): per-head
        logits_eh = (q_hed * k_hed).sum(-1).transpose(0, 1) * self.kernel.scale()  # parameters broadcast as usual
        alpha_eh = softmax(logits_eh, index, ptr, size_i)
        if self.kernel.telemetry is not None:
            self.kernel.telemetry.update(edge_attention_stats(q_i, k_ehd, logits_eh, alpha_eh, index, size_i))
        return alpha_eh.unsqueeze(-1) * (v_j + delta_ehd)


@torch.no_grad()
def edge_attention_stats(q_ehd, k_ehd, logits_eh, alpha_eh, index, size) -> dict[str, float]:
    """quest-core's telemetry statistics for edge attention: raw q/k norms, max logit, mean entropy per query."""
    q_norm, k_norm = q_ehd.float().norm(dim=-1), k_ehd.float().norm(dim=-1)
    plogp = alpha_eh.float() * alpha_eh.float().clamp_min(1e-30).log()
    entropy_nh = -scatter(plogp, index, dim=0, dim_size=size, reduce="sum")
    return {"q_norm_mean": q_norm.mean().item(), "q_norm_max": q_norm.max().item(),
            "k_norm_mean": k_norm.mean().item(), "k_norm_max": k_norm.max().item(),
            "max_logit": logits_eh.max().item(), "entropy_mean": entropy_nh.mean().item()}


class PointBlock(nn.Module):
    """Pre-norm residual block: x + PointAttention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, dim: int, num_heads: int, variant: str):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), PointAttention(dim, num_heads, variant)
        self.norm2, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, pos, edge_index):
        x = x + self.attn(self.norm1(x), pos, edge_index)
        return x + self.mlp(self.norm2(x))


class TransitionDown(nn.Module):
    """FPS to ``ratio`` of the points, then max-pool an MLP of (features, relative position) over k neighbours."""

    def __init__(self, in_dim: int, out_dim: int, ratio: float, k: int):
        super().__init__()
        self.ratio, self.k = ratio, k
        self.mlp = nn.Sequential(nn.Linear(in_dim + 3, out_dim), nn.LayerNorm(out_dim), nn.GELU())

    def forward(self, x, pos, batch):
        idx = fps(pos, batch, self.ratio)
        centre, member = knn(pos, pos[idx], self.k, batch, batch[idx])
        feats = self.mlp(torch.cat([x[member], pos[member] - pos[idx][centre]], dim=-1))
        return scatter(feats, centre, dim=0, dim_size=len(idx), reduce="max"), pos[idx], batch[idx]


class LocalPointTransformer(nn.Module):
    def __init__(self, num_classes: int, variant: str, dims=(32, 64, 128), num_heads: int = 4, k: int = 16,
                 ratio: float = 0.25):
        super().__init__()
        self.k = k
        self.embed = nn.Sequential(nn.Linear(3, dims[0]), nn.LayerNorm(dims[0]), nn.GELU())
        self.blocks = nn.ModuleList(PointBlock(d, num_heads, variant) for d in dims)
        self.downs = nn.ModuleList(TransitionDown(a, b, ratio, k) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Sequential(nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], dims[-1]), nn.GELU(),
                                  nn.Linear(dims[-1], num_classes))

    def forward(self, pos: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        x = self.embed(pos)
        for i, block in enumerate(self.blocks):
            if i > 0:
                x, pos, batch = self.downs[i - 1](x, pos, batch)
            x = block(x, pos, knn_graph(pos, self.k, batch))
        return self.head(scatter(x, batch, dim=0, reduce="mean"))


class GlobalPointTransformer(nn.Module):
    def __init__(self, num_classes: int, variant: str, groups: int = 64, group_size: int = 32, dim: int = 128,
                 depth: int = 4, num_heads: int = 4, point_width: int = 128):
        super().__init__()
        self.groups, self.group_size = groups, group_size
        c = point_width  # Point-MAE's group encoder is 3 -> 128 -> 256, then 512 -> 512 -> dim (point_width 256)
        self.point_mlp = nn.Sequential(nn.Linear(3, c // 2), nn.LayerNorm(c // 2), nn.GELU(), nn.Linear(c // 2, c))
        self.group_mlp = nn.Sequential(nn.Linear(2 * c, 2 * c), nn.LayerNorm(2 * c), nn.GELU(), nn.Linear(2 * c, dim))
        self.pos_embed = nn.Sequential(nn.Linear(3, 128), nn.GELU(), nn.Linear(128, dim))
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.cls_pos = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls, std=0.02)
        nn.init.trunc_normal_(self.cls_pos, std=0.02)
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, variant) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Sequential(nn.Linear(2 * dim, 256), nn.GELU(), nn.Linear(256, num_classes))

    def no_weight_decay(self) -> set[str]:
        return {"cls", "cls_pos"}

    def tokens(self, pos: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Group embeddings (B, G, dim) and centres (B, G, 3): a mini-PointNet over each group's relative positions
        (per-point MLP, concatenated with its max over the group, a second MLP, max again)."""
        counts = torch.bincount(batch)
        if int(counts.min()) < max(self.groups, self.group_size):
            raise ValueError(f"a cloud has {int(counts.min())} points; the global model needs at least "
                             f"max(groups, group_size) = {max(self.groups, self.group_size)}")
        idx = fps(pos, batch, float(self.groups) / float(counts.min()))
        centre_batch = batch[idx]
        keep = torch.cat([torch.nonzero(centre_batch == b).flatten()[: self.groups] for b in range(len(counts))])
        idx, centre_batch = idx[keep], centre_batch[keep]
        centre, member = knn(pos, pos[idx], self.group_size, batch, centre_batch)
        local = (pos[member] - pos[idx][centre]).view(len(idx), self.group_size, 3)
        f = self.point_mlp(local)  # (M, S, c)
        f = torch.cat([f, f.amax(1, keepdim=True).expand_as(f)], dim=-1)
        tokens_md = self.group_mlp(f).amax(1)
        tokens_bgd, _ = to_dense_batch(tokens_md, centre_batch)
        centres_bg3, _ = to_dense_batch(pos[idx], centre_batch)
        return tokens_bgd, centres_bg3

    def forward(self, pos: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        tokens_bgd, centres_bg3 = self.tokens(pos, batch)
        b = tokens_bgd.shape[0]
        x = torch.cat([self.cls.expand(b, -1, -1), tokens_bgd], 1)
        x = x + torch.cat([self.cls_pos.expand(b, -1, -1), self.pos_embed(centres_bg3)], 1)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(torch.cat([x[:, 0], x[:, 1:].amax(1)], dim=-1))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, variant: str):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, num_heads, variant)
        self.norm2, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x_bld: torch.Tensor) -> torch.Tensor:
        x_bld = x_bld + self.attn(self.norm1(x_bld))
        return x_bld + self.mlp(self.norm2(x_bld))


def build_model(name: str, num_classes: int, variant: str, **kwargs) -> nn.Module:
    models = {"local": LocalPointTransformer, "global": GlobalPointTransformer}
    if name not in models:
        raise ValueError(f"unknown model {name!r}; valid: local, global")
    model = models[name](num_classes, variant, **kwargs)
    return model
