"""Every variant on a CUDA device against the float64 reference (forward and gradients), in float32, float16 and
bfloat16, and on PyTorch's fused SDPA kernels (flash attention, memory-efficient attention) rather than only the
math fallback. Skipped without a GPU."""

import contextlib

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import quest_core as qc
from test_attention_reference import make_kernel, params, rand, reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VARIANTS = qc.list_variants()
# Tolerances against float64 relative to the output's scale (~1): the dtype's rounding over a head_dim-64 reduction.
TOLERANCE = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
FUSED = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


def run_on_cuda(variant, dtype, lengths=None, backend=None):
    """Output and input gradients of one kernel call on CUDA in ``dtype``, and the float64 CPU reference's."""
    b, h, l, d = 2, 4, 96, 64
    q, k, v = rand(b, h, l, d, seed=1), rand(b, h, l, d, seed=2), rand(b, h, l, d, seed=3)
    mask = None
    if lengths is not None:
        mask = (torch.arange(l)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    kernel = make_kernel(variant, h, d)
    grad_out = rand(b, h, l, d, seed=4)

    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    expected = reference(q64, k64, v64, variant, mask, params=params(kernel))
    expected.backward(grad_out)

    kernel = kernel.to("cuda", dtype)
    if kernel.spec.uses_metric:  # the fixed stand-in metric is a plain attribute: move it too
        kernel.metric_chain.s = kernel.metric_chain.s.to("cuda", dtype)
        kernel._causal_metric = kernel.metric_chain.s.clone()
    qc_, kc_, vc_ = (t.to("cuda", dtype).requires_grad_() for t in (q, k, v))
    cmask = None if mask is None else mask.cuda()
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        out = kernel(qc_, kc_, vc_, attn_mask=cmask)
        out.backward(grad_out.to("cuda", dtype))
    got = [t.double().cpu() for t in (out, qc_.grad, kc_.grad, vc_.grad)]
    want = [expected.detach(), q64.grad, k64.grad, v64.grad]
    return got, want


def assert_close_scaled(got, want, tol):
    for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
        scale = w.abs().max().item() or 1.0
        err = (g - w).abs().max().item() / scale
        assert err < tol, f"{name}: max error {err:.2e} (relative to max |value| {scale:.3g}) > {tol:.0e}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_cuda_matches_float64_reference(variant, dtype):
    got, want = run_on_cuda(variant, dtype)
    assert_close_scaled(got, want, TOLERANCE[dtype])


@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_key_padding_matches_reference(variant):
    got, want = run_on_cuda(variant, torch.float32, lengths=[96, 17])
    assert_close_scaled(got, want, TOLERANCE[torch.float32])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", FUSED)
def test_runs_on_the_fused_kernels(variant, backend):
    """With only a fused SDPA backend allowed, every variant still runs (forward and backward) and matches the
    reference: quest-core hands SDPA inputs the fused kernels accept, not only the math fallback."""
    dtype = torch.bfloat16
    got, want = run_on_cuda(variant, dtype, backend=FUSED[backend])
    assert_close_scaled(got, want, TOLERANCE[dtype])
