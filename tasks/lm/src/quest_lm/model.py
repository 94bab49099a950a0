"""A GPT-style causal decoder whose attention is a quest-core variant.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual; LayerNorm -> GELU MLP -> residual), learned absolute
position embeddings (GPT-2's choice: the simplest that works at these context lengths; QUEST needs nothing else --
RoPE would commute with its key normalisation, since rotations keep norms), GPT-2 initialisation (normal(0, 0.02),
residual projections scaled by 1/sqrt(2 * depth)). The output layer is either a full softmax over the vocabulary
tied to the input embedding (``adaptive_cutoffs=()``; the `small` preset), or torch's adaptive softmax (Grave et
al. 2017) with frequency-ranked clusters (`tiny`: 2k/6k of WikiText-mini's 13k words, 3x faster on a CPU thread and
no worse; `paper`: 20k/40k/200k of WikiText-103's 267k words, as Transformer-XL does). The adaptive softmax is
untied: torch's layer has no tying to the input embedding, and Transformer-XL's tied adaptive *input* embedding
(Baevski & Auli 2019) is not reproduced here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from quest_core import TransformerBlock


class GPT(nn.Module):
    """Token ids (B, L) -> hidden states (B, L, dim); ``token_nll`` gives the next-token loss per position."""

    def __init__(self, vocab_size: int, variant: str, context: int = 128, dim: int = 128, depth: int = 4,
                 num_heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.1,
                 adaptive_cutoffs: tuple[int, ...] = (), adaptive_div: float = 4.0):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(dim, num_heads, variant, mlp_ratio, dropout)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        cutoffs = [c for c in adaptive_cutoffs if c < vocab_size - 1]
        self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(dim, vocab_size, cutoffs, div_value=adaptive_div) if cutoffs else None
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * depth))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx_bl: torch.Tensor, target_bl: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states (B, L, dim); with ``target_bl``, the (B, L) next-token NLL (``token_nll``), so that a
        training step runs through ``forward`` (which a DistributedDataParallel wrapper synchronises)."""
        if target_bl is not None:
            return self.token_nll(idx_bl, target_bl)
        return self.hidden(idx_bl)

    def hidden(self, idx_bl: torch.Tensor) -> torch.Tensor:
        if idx_bl.shape[1] > self.context:
            raise ValueError(f"sequence length {idx_bl.shape[1]} exceeds the model's context {self.context}")
        pos_l = torch.arange(idx_bl.shape[1], device=idx_bl.device)
        x_bld = self.drop(self.tok_emb(idx_bl) + self.pos_emb(pos_l))
        for block in self.blocks:
            x_bld = block(x_bld, is_causal=True)
        return self.norm(x_bld)

    def logits(self, idx_bl: torch.Tensor) -> torch.Tensor:
        """(B, L, V) next-token log-probabilities (tied softmax) or adaptive-softmax log-probabilities."""
        h_bld = self.hidden(idx_bl)
        if self.adaptive is not None:
            return self.adaptive.log_prob(h_bld.flatten(0, 1)).unflatten(0, h_bld.shape[:2])
        return F.log_softmax(h_bld @ self.tok_emb.weight.T, dim=-1)

    def token_nll(self, idx_bl: torch.Tensor, target_bl: torch.Tensor) -> torch.Tensor:
        """(B, L) negative log-likelihood of each target token, in nats."""
        h_bld = self.hidden(idx_bl)
        if self.adaptive is not None:
            return -self.adaptive(h_bld.flatten(0, 1), target_bl.flatten()).output.view_as(target_bl)
        logits_blv = h_bld @ self.tok_emb.weight.T
        return F.cross_entropy(logits_blv.flatten(0, 1).float(), target_bl.flatten(), reduction="none").view_as(target_bl)
