"""The spurious-pattern sequences of the QUEST paper (Section "spurious patterns"), generated from a seed.

A sample is N tokens; token j is [x_j^k, x_j^v]: a real part x^k ∈ R^{d} and a one-hot value x^v ∈ {0,1}^C.
One answer token sits at a uniformly random position L; the label is its value x_L^v. Non-answer tokens have
x^k ~ N(0, I) and uniformly random values (distractors).

- Unbiased sample: x_L^k ~ N(0, Σ), Σ = diag(signal_var on the first signal_dims dims, 1 elsewhere). The
  covariance difference is the robust signal; finding it needs a key that is nonlinear in x^k (a linear key's
  logit has mean 0 under both distributions) or, when Σ is isotropic (signal_dims = key_dim), a key whose *norm*
  the attention sees. It is in the unbiased samples only.
- Biased sample (probability p_biased): x_L^k ~ N(b, bias_var · I) with one vector b shared by all biased
  samples: an easy shortcut that holds for about half the data. b is fixed by ``data_seed``, not the run seed.
  Biased samples carry no covariance signal (their answer token is not drawn from N(0, Σ)), so the robust reader
  cannot find the answer in them: only the shortcut can.

``bayes_accuracy`` is the accuracy of the Bayes-optimal reader of unbiased samples (exact posterior over the
answer position from the Gaussian likelihood ratio): the ceiling. ``uniform_accuracy`` is the accuracy of a
reader that ignores x^k and attends uniformly (it predicts the most frequent value, which the answer token makes
more likely than 1/C): the floor that a model reading no signal at all reaches. Success is judged between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ProbeData:
    seq_len: int = 16
    key_dim: int = 8
    num_values: int = 8
    signal_dims: int = 4
    signal_var: float = 2.0
    bias_norm: float = 3.0
    bias_var: float = 0.1
    p_biased: float = 0.5
    data_seed: int = 0

    def bias_vector(self) -> torch.Tensor:
        b = torch.randn(self.key_dim, generator=torch.Generator().manual_seed(self.data_seed))
        return b / b.norm() * self.bias_norm

    def sigma_diag(self) -> torch.Tensor:
        diag = torch.ones(self.key_dim)
        diag[: self.signal_dims] = self.signal_var
        return diag

    def sample(self, n: int, generator: torch.Generator, biased: bool | None = None):
        """(x_k (n, N, d), x_v (n, N, C), label (n,), answer position (n,), is_biased (n,))."""
        N, d, C = self.seq_len, self.key_dim, self.num_values
        x_k = torch.randn(n, N, d, generator=generator)
        values = torch.randint(C, (n, N), generator=generator)
        pos = torch.randint(N, (n,), generator=generator)
        if biased is None:
            is_biased = torch.rand(n, generator=generator) < self.p_biased
        else:
            is_biased = torch.full((n,), biased)
        answer_unbiased = torch.randn(n, d, generator=generator) * self.sigma_diag().sqrt()
        answer_biased = self.bias_vector() + torch.randn(n, d, generator=generator) * math.sqrt(self.bias_var)
        rows = torch.arange(n)
        x_k[rows, pos] = torch.where(is_biased[:, None], answer_biased, answer_unbiased)
        x_v = torch.nn.functional.one_hot(values, C).float()
        return x_k, x_v, values[rows, pos], pos, is_biased

    def bayes_accuracy(self, x_k: torch.Tensor, x_v: torch.Tensor, label: torch.Tensor) -> float:
        """Accuracy of the optimal reader of unbiased samples: P(answer at j | x) ∝ N(x_j; 0, Σ) / N(x_j; 0, I)."""
        diag = self.sigma_diag().double()
        x = x_k.double()
        log_ratio = -0.5 * (x.square() * (1 / diag - 1)).sum(-1) - 0.5 * diag.log().sum()
        return _argmax_accuracy(torch.einsum("nj,njc->nc", log_ratio.softmax(-1), x_v.double()), label)

    def uniform_accuracy(self, x_v: torch.Tensor, label: torch.Tensor) -> float:
        """Accuracy of uniform attention: predict the most frequent value (ties split evenly)."""
        return _argmax_accuracy(x_v.double().sum(1), label)


def _argmax_accuracy(score_nc: torch.Tensor, label: torch.Tensor) -> float:
    """Expected accuracy of argmax with ties broken uniformly at random."""
    best = score_nc >= score_nc.max(-1, keepdim=True).values - 1e-12
    hit = best.gather(1, label[:, None]).squeeze(1).double()
    return (hit / best.sum(-1)).mean().item()
