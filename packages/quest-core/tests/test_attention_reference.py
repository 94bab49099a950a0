"""Every variant against an independent float64 reference written from the formulas, with gradients."""

import math

import pytest
import torch

import quest_core as qc
from quest_core import AttentionKernel

VARIANTS = qc.list_variants()
FUNCTIONAL = [v for v in VARIANTS if qc.get_variant(v).is_parameter_free]


def side_reference(x, side, params):
    """One side of a variant in float64, from its declaration (metric, which norm, which gain, which bias) and the
    textbook formulas written out here: s ⊙ x, x/sqrt(Σx²), (x − mean)/sqrt(var + eps), gain · x̂ + bias."""
    if side.metric:  # one sqrt(m) per key/value head; query head h uses that of its group
        metric = params["metric"].double()
        x = x * metric.repeat_interleave(x.shape[1] // metric.shape[0], dim=0)
    if side.norm == "l2":
        x = x / torch.sqrt((x * x).sum(-1, keepdim=True))
    elif side.norm == "layernorm":
        centred = x - x.mean(-1, keepdim=True)
        x = centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + 1e-6)
    if side.gain:
        gain = params[side.gain].double()
        x = x * (side.gain_fn(gain) if side.gain_fn else gain)
    if side.bias:
        x = x + params[side.bias].double()
    return x


def reference(q, k, v, variant, attn_mask=None, is_causal=False, scale=None, params=None):
    """softmax(scale · q̂ k̂ᵀ + mask) v in float64: q̂, k̂ from the declaration (side_reference), the rest written
    out with einsum and an explicit, max-shifted softmax."""
    spec = qc.get_variant(variant)
    q, k, v = q.double(), k.double(), v.double()
    d = q.shape[-1]
    params = dict(params or {})
    if "metric" in params:
        params["metric"] = params["metric"][: k.shape[1]]  # FixedMetric's convention: the first H_kv heads
    q, k = side_reference(q, spec.q, params), side_reference(k, spec.k, params)
    if scale is None:
        scale = {"inv_sqrt_d": 1 / math.sqrt(d), "one": 1.0, "sqrt_d": math.sqrt(d)}[spec.scale_rule]
    group = q.shape[1] // k.shape[1]  # grouped-query attention: query head h reads kv head h // group
    kv_head = torch.arange(q.shape[1]) // group
    k, v = k[:, kv_head], v[:, kv_head]
    logits = scale * torch.einsum("bhid,bhjd->bhij", q, k)
    lq, lk = logits.shape[-2:]
    if is_causal:
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        logits = logits.masked_fill(j > i, -math.inf)
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else logits + attn_mask.double()
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    return torch.einsum("bhij,bhjd->bhid", weights, v)


class FixedMetric:
    """A stand-in for the elliptical metric chain that always gives the same sqrt(m), so that a kernel's output is
    a function of q, k, v alone (for gradcheck); the estimator itself is tested in test_elliptical.py."""

    def __init__(self, s):
        self.s = s

    def next_metric(self, v, head_dim, visible=None):
        return self.s[: v.shape[-3]]  # one per key/value head


def make_kernel(variant, heads, dim, dtype=torch.float64, seed=0):
    """An AttentionKernel with its learnable parameters (if any) set to random non-trivial values, and for the
    elliptical variants a fixed random metric."""
    kernel = AttentionKernel(variant, heads, dim, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in kernel.parameters():
            p.copy_(0.5 + 2 * torch.rand(p.shape, generator=gen, dtype=dtype))
    if kernel.spec.uses_metric:
        kernel.metric_chain = FixedMetric((0.1 + torch.rand(heads, 1, dim, generator=gen, dtype=dtype)).sqrt())
        kernel._causal_metric = kernel.metric_chain.s.clone()  # causal calls use the previous call's estimate
    return kernel


def params(kernel):
    out = {name: p.detach() for name, p in kernel.named_parameters()}
    if kernel.spec.uses_metric:
        out["metric"] = kernel.metric_chain.s
    return out


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


CASES = {
    # name: (q shape, k shape, v shape, mask kind, causal)
    "plain": ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 8), None, False),
    "cross_attention": ((2, 2, 5, 8), (2, 2, 9, 8), (2, 2, 9, 6), None, False),
    "bool_mask": ((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 4), "bool", False),
    "float_mask": ((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 4), "float", False),
    "padding_mask_broadcast": ((3, 2, 5, 8), (3, 2, 5, 8), (3, 2, 5, 8), "padding", False),
    "causal": ((1, 2, 9, 16), (1, 2, 9, 16), (1, 2, 9, 16), None, True),
    "causal_rectangular": ((1, 2, 4, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, True),
    "gqa": ((2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, False),
    "odd_shapes": ((1, 1, 1, 3), (1, 1, 13, 3), (1, 1, 13, 5), None, False),
}


def make_mask(kind, q_shape, k_shape):
    b, h, lq, _ = q_shape
    lk = k_shape[2]
    gen = torch.Generator().manual_seed(1)
    if kind == "bool":
        mask = torch.rand(b, h, lq, lk, generator=gen) > 0.4
        mask[..., 0] = True  # every query sees at least one key
        return mask
    if kind == "float":
        return torch.randn(b, 1, lq, lk, generator=gen, dtype=torch.float64)
    if kind == "padding":  # (B, 1, 1, Lk): key padding, True = attend
        lengths = torch.tensor([lk, 3, 1])[:b]
        return (torch.arange(lk)[None, :] < lengths[:, None])[:, None, None, :]
    return None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_matches_float64_reference(variant, case, dtype, tol):
    q_shape, k_shape, v_shape, mask_kind, causal = CASES[case]
    q, k, v = rand(*q_shape, seed=1), rand(*k_shape, seed=2), rand(*v_shape, seed=3)
    mask = make_mask(mask_kind, q_shape, k_shape)
    kernel = make_kernel(variant, q_shape[1], q_shape[-1])
    expected = reference(q, k, v, variant, mask, causal, None, params(kernel))
    kernel = kernel.to(dtype)
    cast = lambda t: t.to(dtype)  # noqa: E731
    dmask = mask if mask is None or mask.dtype == torch.bool else cast(mask)
    out = kernel(cast(q), cast(k), cast(v), attn_mask=dmask, is_causal=causal)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    if variant in FUNCTIONAL:
        out_fn = qc.attention(cast(q), cast(k), cast(v), variant=variant, attn_mask=dmask, is_causal=causal,
                              enable_gqa=case == "gqa")
        torch.testing.assert_close(out_fn.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("variant", VARIANTS)
def test_explicit_scale_and_need_weights_path(variant):
    q, k, v = rand(2, 2, 5, 8, seed=4), rand(2, 2, 6, 8, seed=5), rand(2, 2, 6, 8, seed=6)
    kernel = make_kernel(variant, 2, 8)
    expected = reference(q, k, v, variant, scale=0.37, params=params(kernel))
    torch.testing.assert_close(kernel(q, k, v, scale=0.37), expected)
    out, probs = kernel(q, k, v, scale=0.37, need_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 5, dtype=torch.float64))


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradcheck(variant):
    q = rand(1, 2, 4, 3, seed=7).requires_grad_()
    k = rand(1, 2, 5, 3, seed=8).requires_grad_()
    v = rand(1, 2, 5, 3, seed=9).requires_grad_()
    mask = torch.tensor([True, True, False, True, True])[None, None, None, :]
    kernel = make_kernel(variant, 2, 3)
    params = list(kernel.parameters())
    names = [n for n, _ in kernel.named_parameters()]

    def fn(q, k, v, *p):
        overrides = dict(zip(names, p))
        return torch.func.functional_call(kernel, overrides, (q, k, v), {"attn_mask": mask})

    assert torch.autograd.gradcheck(fn, (q, k, v, *params))


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_match_reference(variant):
    q, k, v = (rand(2, 2, 6, 4, seed=s).requires_grad_() for s in (10, 11, 12))
    kernel = make_kernel(variant, 2, 4)
    kernel(q, k, v, is_causal=True).square().sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    reference(q, k, v, variant, is_causal=True, params=params(kernel)).square().sum().backward()
    for g, t in zip(got, (q, k, v)):
        torch.testing.assert_close(g, t.grad)


@pytest.mark.parametrize("variant", VARIANTS)
def test_probs_are_the_weights_the_kernel_uses(variant):
    q, k, v = rand(2, 2, 5, 8, seed=13), rand(2, 2, 6, 8, seed=14), rand(2, 2, 6, 8, seed=15)
    kernel = make_kernel(variant, 2, 8)
    out = kernel(q, k, v)  # (elliptical variants: probs uses the metric of the latest call)
    torch.testing.assert_close(kernel.probs(q, k) @ v, out)
