"""The attention variants: what each does to (q, k) before one fused softmax-attention call.

Every variant computes ``softmax(scale · q̂ k̂ᵀ + mask) v`` where (q̂, k̂) is a transform of (q, k):

| variant     | q̂                      | k̂                      | default scale | learnable                      |
|-------------|------------------------|------------------------|---------------|--------------------------------|
| softmax     | q                      | k                      | 1/sqrt(D)     | -                              |
| quest       | q                      | k/‖k‖                  | 1             | -                              |
| qnorm       | q/‖q‖                  | k                      | 1             | -                              |
| qknorm      | g · q/‖q‖              | k/‖k‖                  | 1             | g: one scalar                  |
| qknorm-hs   | g_h · q/‖q‖            | k/‖k‖                  | 1             | g_h: one scalar per head       |
| qknorm-ds   | γ_q ⊙ q/‖q‖            | γ_k ⊙ k/‖k‖            | sqrt(D)       | γ_q, γ_k: one per head dim     |

Norms are L2 over the head dimension D, per head and token.

Choices and initialisations (the paper leaves them open; see ../../../../README.md):

- ``qnorm``: scale 1 and nothing learnable, the mirror image of QUEST (logit = ‖k_j‖ · cos(q_i, k_j)), so
  the Q-only vs K-only ablation differs in exactly one thing.
- ``qknorm`` (Henry et al. 2020, "Query-Key Normalization for Transformers"): logit = g · cos(q_i, k_j). Henry et
  al. initialise g to ``log2(L² − L)`` with L the 97.5th-percentile training sequence length; pass
  ``henry_scale_init(L)`` as ``qk_scale_init`` to do that. Without it, g starts at sqrt(D), the same starting
  temperature as ``qknorm-ds``, which needs no knowledge of the data.
- ``qknorm-hs``: Henry's scalar made per head (same initialisation, one copy per head).
- ``qknorm-ds``: RMS-normalised q and k with per-dimension gains and the standard 1/sqrt(D) scale, the QK-norm of
  ViT-22B (Dehghani et al. 2023) and OLMo 2. RMSNorm(x) = sqrt(D) · x/‖x‖, so this equals unit-normalised q, k
  with gains γ (initialised to 1) and scale sqrt(D): logit = sqrt(D) · Σ_d γ_q,d γ_k,d q̄_d k̄_d.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Literal

ScaleRule = Literal["inv_sqrt_d", "one", "sqrt_d"]
Learnable = Literal["none", "scalar", "head", "dim"]


@dataclass(frozen=True)
class VariantSpec:
    """What one variant does; see the module docstring for the table."""

    name: str
    normalize_q: bool  # divide each query by its L2 norm over the head dim
    normalize_k: bool  # divide each key by its L2 norm over the head dim
    scale_rule: ScaleRule  # the default logit scale when the caller passes scale=None
    learnable: Learnable  # which learnable gains the module form owns ("none": usable in the functional API)
    summary: str  # one line for listings and error messages

    @property
    def is_parameter_free(self) -> bool:
        return self.learnable == "none"

    def default_scale(self, head_dim: int) -> float:
        return {"inv_sqrt_d": 1.0 / math.sqrt(head_dim), "one": 1.0, "sqrt_d": math.sqrt(head_dim)}[self.scale_rule]


_VARIANTS: dict[str, VariantSpec] = {
    spec.name: spec
    for spec in (
        VariantSpec("softmax", False, False, "inv_sqrt_d", "none", "standard scaled dot-product attention"),
        VariantSpec("quest", False, True, "one", "none", "QUEST: unit keys, free queries, scale 1"),
        VariantSpec("qnorm", True, False, "one", "none", "unit queries, free keys, scale 1"),
        VariantSpec("qknorm", True, True, "one", "scalar", "unit q and k, one learnable scale (Henry et al. 2020)"),
        VariantSpec("qknorm-hs", True, True, "one", "head", "unit q and k, a learnable scale per head"),
        VariantSpec("qknorm-ds", True, True, "sqrt_d", "dim", "RMS-normed q and k with per-dim gains (ViT-22B)"),
    )
}


def list_variants() -> list[str]:
    """The names of all registered attention variants."""
    return list(_VARIANTS)


def get_variant(name: str) -> VariantSpec:
    """Look a variant up by name; unknown names fail with the valid ones and a suggestion."""
    if isinstance(name, VariantSpec):
        return name
    try:
        return _VARIANTS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), _VARIANTS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown attention variant {name!r}; valid variants: {', '.join(_VARIANTS)}.{hint}"
        ) from None


def henry_scale_init(seq_len: int) -> float:
    """Henry et al. (2020)'s initial QKNorm scale g0 = log2(L² − L) for sequences of length L (L ≥ 2)."""
    if seq_len < 2:
        raise ValueError(f"henry_scale_init needs seq_len >= 2, got {seq_len}")
    return math.log2(seq_len * seq_len - seq_len)
