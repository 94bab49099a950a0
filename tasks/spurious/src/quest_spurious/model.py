"""The probe model: one attention read-out with a learned query over keys from a small nonlinear key network.

    k_j = W2 · gelu(W1 · x_j^k)        (keys must be nonlinear in x^k to see a covariance difference;
                                        ``linear_keys``: k_j = W · x_j^k, for the norm-only design)
    a   = attention(q, k, x^v)          (q: one learned query vector; the variant decides how q, k are used)
    ŷ   = W_out · a                     (logits over the C values)

Values are the one-hot value parts themselves, so the only way to answer is to attend to the answer token.
"""

from __future__ import annotations

import torch
from torch import nn

from quest_core import AttentionKernel


class ProbeModel(nn.Module):
    def __init__(self, variant: str, key_dim: int, num_values: int, head_dim: int = 16, hidden: int = 32,
                 query_init_norm: float = 4.0, linear_keys: bool = False):
        super().__init__()
        if linear_keys:
            self.key_net = nn.Linear(key_dim, head_dim, bias=False)  # no bias: key direction carries no signal
        else:
            self.key_net = nn.Sequential(nn.Linear(key_dim, hidden), nn.GELU(), nn.Linear(hidden, head_dim))
        query = torch.randn(head_dim)
        self.query = nn.Parameter(query / query.norm() * query_init_norm)  # ‖q‖ is QUEST's initial temperature
        self.kernel = AttentionKernel(variant, num_heads=1, head_dim=head_dim)
        self.out = nn.Linear(num_values, num_values)

    def keys(self, x_k_bnd: torch.Tensor) -> torch.Tensor:
        """Raw (pre-normalisation) keys, (B, N, head_dim)."""
        return self.key_net(x_k_bnd)

    def forward(self, x_k_bnd: torch.Tensor, x_v_bnc: torch.Tensor) -> torch.Tensor:
        b = x_k_bnd.shape[0]
        k_b1nd = self.keys(x_k_bnd).unsqueeze(1)
        q_b11d = self.query.expand(b, 1, 1, -1)
        out_b11c = self.kernel(q_b11d, k_b1nd, x_v_bnc.unsqueeze(1))
        return self.out(out_b11c[:, 0, 0])
