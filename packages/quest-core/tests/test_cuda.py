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


@pytest.mark.parametrize("variant", ["quest", "qnorm", "qknorm", "qk-layernorm"])
def test_inductor_on_cuda_matches_eager(variant):
    """torch.compile's inductor backend on the GPU (Triton code generation): outputs and gradients equal eager."""
    torch.manual_seed(0)
    kernel = qc.AttentionKernel(variant, 4, 64, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(kernel, fullgraph=True)
    results = []
    for fn in (kernel, compiled):
        q, k, v = (rand(2, 4, 96, 64, seed=s).to("cuda", torch.bfloat16).requires_grad_() for s in range(3))
        kernel.zero_grad(set_to_none=True)
        out = fn(q, k, v, is_causal=True)
        out.float().square().sum().backward()
        results.append([out, q.grad, k.grad, v.grad, *(p.grad for p in kernel.parameters())])
    for compiled_t, eager_t in zip(results[1], results[0]):
        assert eager_t.abs().sum() > 0
        torch.testing.assert_close(compiled_t.float(), eager_t.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vit_small_blocks_memory_on_cuda(dtype):
    """The ViT-S block-stack memory targets with CUDA's allocator (torch.cuda.max_memory_allocated)."""
    timm = pytest.importorskip("timm")
    import copy

    torch.manual_seed(0)
    blocks = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2).blocks
    x = torch.randn(16, 197, 384, device="cuda", dtype=dtype)
    counts = {}
    for variant in ["stock", "quest", "qknorm", "qk-layernorm"]:
        model = copy.deepcopy(blocks).to("cuda", dtype)
        if variant != "stock":
            qc.swap_attention(model, variant)
        saved = qc.saved_bytes(lambda: model(x.clone().requires_grad_()))
        peak = qc.peak_bytes(lambda: model(x.clone().requires_grad_()).float().square().sum().backward(), "cuda")
        counts[variant] = (saved, peak)
    stock_saved, stock_peak = counts.pop("stock")
    for variant, (saved, peak) in counts.items():
        assert saved <= (1.01 if variant == "quest" else 1.02) * stock_saved, (variant, saved / stock_saved)
        assert peak <= 1.10 * stock_peak, (variant, peak / stock_peak)
