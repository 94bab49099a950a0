"""Every variant under torch.compile: outputs and all gradients equal eager, and no graph breaks.

Compiled code is a second execution path (dynamo traces the custom autograd Function, AOT autograd partitions the
backward): it once returned all-zero key gradients while the outputs matched. The "eager" backend checks dynamo's
trace, "aot_eager" adds AOT autograd's joint graph and partitioner, "inductor" generates code (a C++ compiler is
needed on CPU; slow, so one case).
"""

import pytest
import torch
import torch._dynamo

import quest_core as qc
from core_helpers import rand, standalone_kernel

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}
MASKS = ["none", "bool", "float", "causal"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def inputs(dtype, heads=2, seed=0):
    q, k, v = (rand(2, heads, 6, 8, dtype=torch.float64, seed=seed + s).to(dtype) for s in range(3))
    k = k * torch.linspace(0.2, 3.0, 6, dtype=dtype)[:, None]  # keys of different norms: normalisation matters
    return q, k, v


def mask_args(kind, dtype):
    keep = rand(6, 6, seed=9) > -0.5
    keep[:, 0] = True
    if kind == "bool":
        return {"attn_mask": keep}
    if kind == "float":
        return {"attn_mask": torch.zeros(6, 6, dtype=dtype).masked_fill(~keep, float("-inf"))}
    return {"is_causal": kind == "causal"}


def grads_of(fn, kernel, dtype, mask):
    """Output and the gradients of q, k, v and of the kernel's parameters for one call of ``fn``."""
    q, k, v = (t.clone().requires_grad_() for t in inputs(dtype))
    if kernel is not None:
        kernel.zero_grad(set_to_none=True)
    out = fn(q, k, v, **mask_args(mask, dtype))
    (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    params = [] if kernel is None else [p.grad for p in kernel.parameters()]
    return [out, q.grad, k.grad, v.grad, *params]


def assert_same(compiled, eager, dtype):
    assert len(compiled) == len(eager)
    for ours, ref in zip(compiled, eager):
        assert ref is not None and ours is not None
        assert ref.abs().sum() > 0  # a gradient that is all zero in eager would hide the bug
        torch.testing.assert_close(ours, ref, rtol=TOL[dtype], atol=TOL[dtype])


FUNCTIONAL = [v for v in qc.list_variants() if qc.get_variant(v).is_parameter_free]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("variant", FUNCTIONAL)
def test_functional_attention_compiles_to_the_eager_values_and_gradients(variant, dtype, backend="aot_eager"):
    def fn(q, k, v, **kw):
        return qc.attention(q, k, v, variant=variant, **kw)

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for mask in MASKS:
        assert_same(grads_of(compiled, None, dtype, mask), grads_of(fn, None, dtype, mask), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("variant", qc.list_variants())
def test_every_kernel_compiles_to_the_eager_values_and_gradients(variant, dtype, backend="aot_eager"):
    kernel = standalone_kernel(variant, 2, 8, dtype=dtype)
    with torch.no_grad():  # non-trivial gains, so that their gradients and scaling are exercised
        for i, p in enumerate(kernel.parameters()):
            p.mul_(1.0 + 0.1 * (i + 1))
    compiled = torch.compile(kernel, backend=backend, fullgraph=True)
    for mask in MASKS:
        eager = grads_of(kernel, kernel, dtype, mask)
        assert_same(grads_of(compiled, kernel, dtype, mask), eager, dtype)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_l2_normalize_compiled_gradient_is_not_zero(backend):
    """The original bug: a no-op dtype cast on a custom Function's output made compiled input gradients zero."""
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = rand(3, 4, 8, dtype=dtype).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        weight = torch.linspace(-1, 1, 8, dtype=dtype)
        (torch.compile(qc.l2_normalize, backend=backend)(x) * weight).sum().backward()
        (qc.l2_normalize(x_ref) * weight).sum().backward()
        assert x_ref.grad.abs().sum() > 0
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("variant", qc.list_variants())
def test_no_graph_breaks_in_any_variants_modules(variant):
    torch.manual_seed(0)
    mha = qc.MultiheadAttention(16, 2, variant=variant, batch_first=True)
    qc.link_elliptical(mha)
    x = rand(2, 5, 16)
    explained = torch._dynamo.explain(mha)(x, x, x, need_weights=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    qc.swap_attention(model, variant)
    explained = torch._dynamo.explain(model)(x, is_causal=False)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["quest", "qknorm"])
def test_inductor_matches_eager(variant):
    pytest.importorskip("torch._inductor")
    kernel = standalone_kernel(variant, 2, 8, dtype=torch.float32)
    compiled = torch.compile(kernel, backend="inductor", fullgraph=True)
    for mask in ("none", "causal"):
        eager = grads_of(kernel, kernel, torch.float32, mask)
        assert_same(grads_of(compiled, kernel, torch.float32, mask), eager, torch.float32)
