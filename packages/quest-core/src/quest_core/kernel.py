"""AttentionKernel: one variant's (q, k) transform, its learnable scales (if any), and the fused SDPA call."""

from __future__ import annotations

import torch
from torch import nn

from quest_core.elliptical import MetricChain, in_recomputation, link_running_model, visible_keys
from quest_core.functional import RecomputeSaved, attention_probs, check_inputs, sdpa, transform_qk
from quest_core.telemetry import LayerStats, attention_stats
from quest_core.variants import get_variant


class AttentionKernel(nn.Module):
    """softmax(scale · q̂ k̂ᵀ + mask) v for one variant, on (..., H, L, D) tensors.

    Owns the learnable parameters its variant declares (``quest_core.variants``: name, shape, initialisation);
    e.g. ``qknorm``: ``q_gain`` (1,); ``qknorm-hs``: ``q_gain`` (H, 1, 1); ``qknorm-ds``: ``q_gain`` and ``k_gain``
    (D,); ``cosine``: ``logit_scale`` (H, 1, 1). ``qk_scale_init`` overrides the initial temperature of the
    qknorm/qknorm-hs scale (default sqrt(D); Henry et al.'s is ``quest_core.henry_scale_init(seq_len)``) and of
    ``cosine`` (default 10).

    Loading a state dict that has none of these parameters (a checkpoint of the model before ``swap_attention``,
    or of a parameter-free variant) fills them with their initial values, so ``load_state_dict(strict=True)`` works
    and the swapped model starts where a fresh one would. Parameters whose shape does not fit the input's heads or
    head dim fail with a clear error.
    """

    def __init__(
        self,
        variant: str,
        num_heads: int,
        head_dim: int,
        qk_scale_init: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backend: str = "sdpa",
    ):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        self.backend = backend
        self.spec = get_variant(variant)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.telemetry: LayerStats | None = None  # set by quest_core.Telemetry
        shapes = {"scalar": (1,), "head": (num_heads, 1, 1), "dim": (head_dim,)}
        for p in self.spec.params:
            value = p.init(head_dim, qk_scale_init)
            setattr(self, p.name, nn.Parameter(torch.full(shapes[p.shape], value, device=device, dtype=dtype)))
        self._param_init = {name: p.detach().clone() for name, p in self.named_parameters(recurse=False)}
        self.register_load_state_dict_pre_hook(_fill_missing_params)
        self.metric_chain: MetricChain | None = None  # elliptical variants: linked at the first call (link_elliptical)
        self._recorded: list[torch.Tensor] = []  # the metrics of this kernel's calls in the model's latest forward
        self._recorded_generation = -1  # ... and which forward of the chain that was
        self._metric: torch.Tensor | None = None  # the metric of the latest call (elliptical variants)
        self._causal_metric: torch.Tensor | None = None  # causal calls: the estimate of this layer's last training call

    def params(self) -> dict[str, torch.Tensor]:
        """The variant's parameters by name (and, for elliptical variants, the current metric as "metric")."""
        out = {p.name: getattr(self, p.name) for p in self.spec.params}
        if self.spec.uses_metric:
            if self._metric is None:
                raise RuntimeError(f"variant {self.variant!r} has no metric yet: the kernel's forward estimates it "
                                   "(or call update_metric(v) before transform)")
            out["metric"] = self._metric
        return out

    def update_metric(self, v: torch.Tensor, causal: bool = False, attn_mask: torch.Tensor | None = None) -> None:
        """Elliptical variants: this call's metric from the values v (..., H, L, D); a no-op otherwise.

        The estimate is per sequence, over the keys some query can see under ``attn_mask``. With ``causal``
        attention a token would see a statistic of the tokens after it: there, as BatchNorm does with its running
        statistics, a call uses the batch-averaged estimate of this layer's previous training call (M = I before
        the first) and, in training mode, stores its own for the next.
        """
        if not self.spec.uses_metric:
            return
        if in_recomputation():  # activation checkpointing: replay the original forward's metric
            self._metric = self._replayed_metric(v)
            return
        chain = self.metric_chain or link_running_model(self)
        if isinstance(chain, MetricChain):  # (a stand-in chain in tests gives a fixed metric)
            chain.enter(self)
        generation = getattr(chain, "generation", None)  # a stand-in chain (a fixed metric in tests): each call alone
        if generation is None or self._recorded_generation != generation:
            self._recorded, self._recorded_generation = [], generation
        if not causal:
            self._metric = chain.next_metric(v, self.head_dim, visible_keys(attn_mask))
        else:
            estimate = chain.next_metric(v, self.head_dim)
            estimate = estimate.flatten(0, -4).mean(0) if estimate.dim() > 3 else estimate  # one for every sequence
            if self._causal_metric is None or self._causal_metric.shape != estimate.shape:
                self._causal_metric = torch.ones_like(estimate)
            self._metric = self._causal_metric
            if self.training:
                self._causal_metric = estimate
        self._recorded.append(self._metric)

    def _replayed_metric(self, v: torch.Tensor) -> torch.Tensor:
        """The metric this kernel used in the forward being recomputed (see quest_core.elliptical)."""
        if len(self._recorded) != 1:
            raise RuntimeError(
                f"an elliptical kernel ({self.variant!r}) is recomputed under activation checkpointing, but it was "
                f"called {len(self._recorded)} times in the model's latest forward, so the metric to replay is "
                "ambiguous; checkpoint only modules whose elliptical kernels run once per forward")
        metric = self._recorded[0]
        if metric.shape[:-2] not in (v.shape[:-2], v.shape[-3:-2]):
            raise RuntimeError(
                f"an elliptical kernel's recomputation has values of shape {tuple(v.shape)}, but the model's latest "
                f"forward used a metric of shape {tuple(metric.shape)}: call backward before the next forward")
        return metric

    def transform(self, q: torch.Tensor, k: torch.Tensor, saved: RecomputeSaved | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q̂, k̂): the variant's transform of q and k, laid out (..., H, L, D) (or (H, E, D) per edge); with
        ``saved``, registered for recomputation in backward (see ``quest_core.functional.RecomputeSaved``)."""
        self.check_shapes(q)
        return transform_qk(self.spec, q, k, self.params(), saved)

    def scale(self) -> float:
        """The variant's logit scale for this kernel's head dim."""
        return self.spec.default_scale(self.head_dim)

    def check_shapes(self, q_bhld: torch.Tensor) -> None:
        """Parameters broadcast against (..., H, L, D) only if the input has this kernel's heads and head dim."""
        if (self.spec.params or self.spec.uses_metric) and (q_bhld.shape[-3], q_bhld.shape[-1]) != (
                self.num_heads, self.head_dim):
            raise ValueError(
                f"variant {self.variant!r} has parameters for {self.num_heads} heads of dim {self.head_dim}, but "
                f"the query has {q_bhld.shape[-3]} heads of dim {q_bhld.shape[-1]} (shape {tuple(q_bhld.shape)}); "
                "build the kernel with the model's num_heads and head_dim"
            )

    @property
    def variant(self) -> str:
        return self.spec.name

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, num_heads={self.num_heads}, head_dim={self.head_dim}"

    def probs(
        self, q_bhld: torch.Tensor, k_bhld: torch.Tensor, attn_mask: torch.Tensor | None = None,
        is_causal: bool = False, scale: float | None = None,
    ) -> torch.Tensor:
        """The (B, H, Lq, Lk) attention matrix this kernel uses for q and k (materialised: for figures)."""
        q_bhld, k_bhld = self.transform(q_bhld, k_bhld)
        scale = self.spec.default_scale(q_bhld.shape[-1]) if scale is None else scale
        return attention_probs(q_bhld, k_bhld, scale, attn_mask, is_causal)

    def forward(
        self,
        q_bhld: torch.Tensor,
        k_bhld: torch.Tensor,
        v_bhld: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        scale: float | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The attention output (B, H, Lq, Dv); with ``need_weights`` also the (B, H, Lq, Lk) probabilities.

        ``need_weights`` materialises the attention matrix (the explicit path, as torch's MHA does);
        otherwise the call is one fused SDPA kernel, or the Triton kernel (``backend``, see ``BACKENDS``).
        """
        check_inputs(q_bhld, k_bhld, v_bhld, attn_mask, is_causal)
        if self.backend != "sdpa" and not need_weights:
            fused = self._fused_call(q_bhld, k_bhld, v_bhld, attn_mask, is_causal, dropout_p, scale)
            if fused is not None:
                return fused
        q_raw, k_raw = q_bhld, k_bhld
        self.update_metric(v_bhld, causal=is_causal, attn_mask=attn_mask)
        saved = RecomputeSaved()
        with saved.hooks():  # q̂, k̂ (and the metric-scaled q, k) are recomputed in backward, not stored
            q_bhld, k_bhld = self.transform(q_bhld, k_bhld, saved)
            scale = self.spec.default_scale(q_bhld.shape[-1]) if scale is None else scale
            if self.telemetry is not None:
                self.telemetry.update(
                    attention_stats(
                        q_raw, k_raw, q_bhld, k_bhld, scale, attn_mask, is_causal, self.telemetry.max_queries
                    )
                )
            if not need_weights:
                return sdpa(q_bhld, k_bhld, v_bhld, scale, attn_mask, is_causal, dropout_p)
        probs = attention_probs(q_bhld, k_bhld, scale, attn_mask, is_causal)
        dropped = nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs
        if v_bhld.shape[-3] != probs.shape[-3]:
            v_bhld = v_bhld.repeat_interleave(probs.shape[-3] // v_bhld.shape[-3], dim=-3)
        return dropped @ v_bhld, probs


    def _fused_call(self, q, k, v, attn_mask, is_causal, dropout_p, scale) -> torch.Tensor | None:
        """The Triton kernel's output where it applies; None to take the SDPA path (``auto``); an error under
        ``backend="fused"`` where it does not apply, with the reason."""
        from quest_core.fused import fused_arguments, fused_attention, fused_supported, key_padding_from_mask

        padding = key_padding_from_mask(attn_mask, q, k)
        why = None
        if self.backend == "auto" and q.device.type != "cuda":
            return None  # the interpreter (TRITON_INTERPRET=1) only under backend="fused": it is for tests
        if torch.compiler.is_compiling():
            why = "torch.compile traces the SDPA path (the Triton kernel would be a graph break)"
        elif self.telemetry is not None:
            why = "telemetry reads q̂ and k̂, which the fused kernel never materialises"
        elif scale is not None and scale != self.scale():
            why = f"scale={scale} differs from the variant's own ({self.scale()})"
        else:
            ok, why = fused_supported(q, k, v, attn_mask=None if padding is not None else attn_mask,
                                      key_padding_mask=padding, dropout_p=dropout_p, is_causal=is_causal,
                                      variant=self.spec)
            if ok:
                self.check_shapes(q)
                return fused_attention(q, k, v, is_causal=is_causal, key_padding_mask=padding,
                                       **fused_arguments(self.spec, self.head_dim, self.params()))
        if self.backend == "fused":
            raise ValueError(f"backend='fused' cannot run this call: {why}; use backend='auto' to fall back to SDPA")
        return None


BACKENDS = ("sdpa", "fused", "auto")  # sdpa: transform + F.scaled_dot_product_attention (default, any device);
# fused: quest_core.fused's Triton kernel, an error where it does not apply; auto: fused for CUDA tensors where it
# applies, else sdpa


def _fill_missing_params(module: AttentionKernel, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: variant parameters absent from ``state_dict`` are loaded as their initial values."""
    for name, init in module._param_init.items():
        state_dict.setdefault(prefix + name, init.clone())


def no_weight_decay(model: nn.Module) -> set[int]:
    """ids of the attention-variant parameters in ``model`` that their declaration excludes from weight decay."""
    out = set()
    for module in model.modules():
        if isinstance(module, AttentionKernel):
            out |= {id(getattr(module, p.name)) for p in module.spec.params if not p.weight_decay}
    return out
