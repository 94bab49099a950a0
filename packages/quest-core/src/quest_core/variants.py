"""The attention variants, each one declaration registered here: what it does to (q, k) before one fused
softmax-attention call, the parameters it owns with their initialisation, and where it comes from.

Every variant computes ``softmax(scale · q̂ k̂ᵀ + mask) v`` where q̂ = gain ⊙ norm(q) (+ bias), k̂ likewise:

| variant      | q̂                    | k̂                    | scale     | learnable (init)                        |
|--------------|----------------------|----------------------|-----------|-----------------------------------------|
| softmax      | q                    | k                    | 1/sqrt(D) | -                                       |
| quest        | q                    | k/‖k‖                | 1         | -                                       |
| qnorm        | q/‖q‖                | k                    | 1         | -                                       |
| qknorm       | g · q/‖q‖            | k/‖k‖                | 1         | g: one scalar (sqrt(D))                 |
| qknorm-hs    | g_h · q/‖q‖          | k/‖k‖                | 1         | g_h: one per head (sqrt(D))             |
| qknorm-ds    | γ_q ⊙ q/‖q‖          | γ_k ⊙ k/‖k‖          | sqrt(D)   | γ_q, γ_k: one per head dim (1)          |
| cosine       | τ_h · q/‖q‖          | k/‖k‖                | 1         | log τ_h per head (log 10), τ ≤ 100      |
| qk-layernorm | LN(q; γ_q, β_q)      | LN(k; γ_k, β_k)      | 1/sqrt(D) | γ (1), β (0) per head dim, for q and k  |
| elliptical   | s ⊙ q                | s ⊙ k                | 1/sqrt(D) | - (s = sqrt(m), m estimated, see below) |
| elliptical-quest | s ⊙ q            | s ⊙ k / ‖s ⊙ k‖      | 1         | - (the same m)                          |

Norms are L2 over the head dimension D, per head and token; LN is LayerNorm over D (eps 1e-6).

Choices and initialisations (documented in docs/quest-core.md):

- ``qnorm``: scale 1 and nothing learnable, the mirror image of QUEST (logit = ‖k_j‖ · cos(q_i, k_j)).
- ``qknorm`` (Henry et al. 2020): logit = g · cos(q_i, k_j). Henry et al. initialise g to ``log2(L² − L)``; pass
  ``henry_scale_init(L)`` as ``qk_scale_init`` to do that. Without it g starts at sqrt(D).
- ``qknorm-hs``: Henry's scalar made per head (same initialisation).
- ``qknorm-ds``: unit q and k with per-dimension gains and scale sqrt(D), i.e. RMS-normalised q and k with learnable
  RMSNorm weights and the usual 1/sqrt(D) (the QK-RMSNorm of OLMo 2 and Gemma 3). It is *not* ViT-22B's QK norm,
  which is LayerNorm (``qk-layernorm``).
- ``cosine`` (Swin Transformer v2, Liu et al. 2022): logit = τ_h · cos(q_i, k_j) with a learnable per-head log
  temperature, clamped at log 100 and initialised to log 10, as Swin-v2's code does. ``qk_scale_init`` sets τ's
  initial value instead.
- ``qk-layernorm`` (ViT-22B, Dehghani et al. 2023): LayerNorm with weight and bias on q and k, then the standard
  scaled dot product.
- ``elliptical`` (Nielsen et al. 2024, Elliptical Attention): logit = q^T M k / sqrt(D) with M = diag(m) per head,
  m_d the mean absolute change of the values' coordinate d between this attention layer and the previous one
  (over batch and tokens), divided by its maximum over d. ``elliptical-quest`` normalises the keys in that metric
  (k / ‖k‖_M, ‖k‖_M² = k^T M k) and drops the scale, as QUEST does. The metric needs the previous layer's values:
  ``quest_core.link_elliptical(model)`` (called by ``swap_attention``) links a model's kernels into one chain that
  restarts at every forward of the model; see ``quest_core.elliptical`` for what the paper leaves open and what
  we chose.

To add a variant, declare it with ``register_variant(Variant(...))``: the kernel, the functional API (if it has no
parameters), the weight-decay grouping, telemetry and surgery use the declaration, and ``variants: all`` in a suite
picks it up.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Callable, Literal

Norm = Literal["none", "l2", "layernorm"]
ScaleRule = Literal["inv_sqrt_d", "one", "sqrt_d"]
Shape = Literal["scalar", "head", "dim"]


@dataclass(frozen=True)
class Param:
    """A learnable parameter a variant owns, an attribute of ``AttentionKernel``.

    ``shape``: "scalar" (1,), "head" (H, 1, 1) or "dim" (D,), broadcast against (..., H, L, D).
    ``init(head_dim, qk_scale_init)`` gives its initial value (the same for every entry).
    ``weight_decay``: whether AdamW should decay it (``quest_core.no_weight_decay``).
    """

    name: str
    shape: Shape
    init: Callable[[int, float | None], float]
    weight_decay: bool = False


@dataclass(frozen=True)
class Side:
    """What a variant does to the queries (or the keys): normalise, then scale by a gain, then add a bias.

    ``gain`` / ``bias`` name parameters of the variant; ``gain_fn`` maps the gain parameter to the gain applied
    (e.g. the exponential of a clamped log temperature); without it the parameter is the gain.
    """

    norm: Norm = "none"
    gain: str | None = None
    gain_fn: Callable | None = None
    bias: str | None = None
    metric: bool = False  # multiply by the kernel's estimated metric sqrt(m) before normalising (elliptical)


@dataclass(frozen=True)
class Variant:
    """One attention variant (see the module docstring)."""

    name: str
    q: Side
    k: Side
    scale_rule: ScaleRule
    summary: str  # one line for listings and error messages
    citation: str  # where it comes from, one line
    params: tuple[Param, ...] = field(default=())

    @property
    def is_parameter_free(self) -> bool:
        return not self.params and not self.uses_metric

    @property
    def uses_metric(self) -> bool:
        """Whether the variant needs an estimated metric (state carried between layers): a module, not functional."""
        return self.q.metric or self.k.metric

    def default_scale(self, head_dim: int) -> float:
        return {"inv_sqrt_d": 1.0 / math.sqrt(head_dim), "one": 1.0, "sqrt_d": math.sqrt(head_dim)}[self.scale_rule]


VariantSpec = Variant  # the earlier name, kept for imports

_VARIANTS: dict[str, Variant] = {}


def register_variant(variant: Variant) -> Variant:
    """Add a variant to the registry (names are unique and file-name safe)."""
    if variant.name in _VARIANTS:
        raise ValueError(f"attention variant {variant.name!r} is already registered")
    if not variant.name.replace("-", "").isalnum():
        raise ValueError(f"variant names use letters, digits and '-', got {variant.name!r}")
    names = {p.name for p in variant.params}
    for side in (variant.q, variant.k):
        for ref in (side.gain, side.bias):
            if ref is not None and ref not in names:
                raise ValueError(f"variant {variant.name!r} uses parameter {ref!r} but declares {sorted(names)}")
    _VARIANTS[variant.name] = variant
    return variant


def list_variants() -> list[str]:
    """The names of all registered attention variants."""
    return list(_VARIANTS)


def get_variant(name: str) -> Variant:
    """Look a variant up by name; unknown names fail with the valid ones and a suggestion."""
    if isinstance(name, Variant):
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


def _sqrt_d(head_dim: int, override: float | None) -> float:
    return math.sqrt(head_dim) if override is None else float(override)


def _one(head_dim: int, override: float | None) -> float:
    return 1.0


def _zero(head_dim: int, override: float | None) -> float:
    return 0.0


def _log_ten(head_dim: int, override: float | None) -> float:
    return math.log(10.0 if override is None else float(override))


COSINE_MAX_LOG_SCALE = math.log(100.0)  # Swin-v2 clamps the learned temperature at 100


def cosine_temperature(log_scale):
    """Swin-v2's per-head temperature: exp(min(log τ, log 100))."""
    return log_scale.clamp(max=COSINE_MAX_LOG_SCALE).exp()


for _variant in (
    Variant("softmax", Side(), Side(), "inv_sqrt_d", "standard scaled dot-product attention",
            "Vaswani et al. 2017, Attention Is All You Need"),
    Variant("quest", Side(), Side("l2"), "one", "QUEST: unit keys, free queries, scale 1",
            "Govindarajan et al. 2026, QUEST (arXiv 2604.00199)"),
    Variant("qnorm", Side("l2"), Side(), "one", "unit queries, free keys, scale 1",
            "the QUEST paper's Q-only ablation"),
    Variant("qknorm", Side("l2", gain="q_gain"), Side("l2"), "one",
            "unit q and k, one learnable scale", "Henry et al. 2020, Query-Key Normalization for Transformers",
            (Param("q_gain", "scalar", _sqrt_d),)),
    Variant("qknorm-hs", Side("l2", gain="q_gain"), Side("l2"), "one",
            "unit q and k, a learnable scale per head", "Henry et al. 2020, with one scale per head",
            (Param("q_gain", "head", _sqrt_d),)),
    Variant("qknorm-ds", Side("l2", gain="q_gain"), Side("l2", gain="k_gain"), "sqrt_d",
            "RMS-normed q and k with per-dim gains (QK-RMSNorm)", "QK-RMSNorm as in OLMo 2 (OLMo et al. 2024)",
            (Param("q_gain", "dim", _one), Param("k_gain", "dim", _one))),
    Variant("cosine", Side("l2", gain="logit_scale", gain_fn=cosine_temperature), Side("l2"), "one",
            "cosine similarity times a learnable per-head temperature",
            "Liu et al. 2022, Swin Transformer V2", (Param("logit_scale", "head", _log_ten),)),
    Variant("qk-layernorm", Side("layernorm", gain="q_ln_weight", bias="q_ln_bias"),
            Side("layernorm", gain="k_ln_weight", bias="k_ln_bias"), "inv_sqrt_d",
            "LayerNorm on q and k, then scaled dot product", "Dehghani et al. 2023, Scaling ViT to 22B (ViT-22B)",
            (Param("q_ln_weight", "dim", _one), Param("q_ln_bias", "dim", _zero),
             Param("k_ln_weight", "dim", _one), Param("k_ln_bias", "dim", _zero))),
    Variant("elliptical", Side(metric=True), Side(metric=True), "inv_sqrt_d",
            "Mahalanobis dot product with a metric estimated from consecutive layers' values",
            "Nielsen et al. 2024, Elliptical Attention (NeurIPS)"),
    Variant("elliptical-quest", Side(metric=True), Side("l2", metric=True), "one",
            "elliptical metric with keys normalised in it, scale 1 (QUEST's form)",
            "the QUEST paper's Elliptical-QUEST baseline"),
):
    register_variant(_variant)
