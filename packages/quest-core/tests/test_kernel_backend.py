"""AttentionKernel's backend switch: "sdpa" (default), "fused" (the Triton kernel, an error where it does not
apply) and "auto" (fused where it applies, else SDPA). On a CPU the fused path runs in Triton's interpreter."""

import pytest
import torch

import quest_core as qc
from core_helpers import rand

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def kernels(variant, backend):
    torch.manual_seed(0)
    ours = qc.AttentionKernel(variant, 2, 16, backend=backend)
    ref = qc.AttentionKernel(variant, 2, 16)
    with torch.no_grad():
        for p, p_ref in zip(ours.parameters(), ref.parameters()):
            p.mul_(1.3), p_ref.copy_(p)
    return ours, ref


@pytest.mark.parametrize("variant", ["quest", "qknorm-hs"])  # the kernel itself: test_fused_triton.py
def test_fused_backend_equals_sdpa_with_padding_and_causal(variant, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ours, ref = kernels(variant, "fused")
    padding = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])[:, None, None, :]  # (B, 1, 1, Lk)
    for kwargs in ({"attn_mask": padding}, {"is_causal": True}):
        grads = []
        for kernel in (ours, ref):
            q, k, v = (rand(2, 2, 8, 16, seed=s).requires_grad_() for s in range(3))
            kernel.zero_grad()
            out = kernel(q, k, v, **kwargs)
            (out * torch.linspace(-1, 1, 16)).sum().backward()
            grads.append([out, q.grad, k.grad, v.grad, *(p.grad for p in kernel.parameters())])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_fused_backend_refuses_what_it_cannot_run_and_auto_falls_back(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = rand(1, 2, 8, 16)
    with pytest.raises(ValueError, match="backend='fused' cannot run this call: tensors are on cpu"):
        qc.AttentionKernel("quest", 2, 16, backend="fused")(q, q, q)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    general_mask = rand(8, 8) > 0  # varies over query rows: not a key-padding mask
    with pytest.raises(ValueError, match="general attn_mask is not fused"):
        qc.AttentionKernel("quest", 2, 16, backend="fused")(q, q, q, attn_mask=general_mask)
    with pytest.raises(ValueError, match="layernorm"):
        qc.AttentionKernel("qk-layernorm", 2, 16, backend="fused")(q, q, q)
    auto = qc.AttentionKernel("quest", 2, 16, backend="auto")
    torch.testing.assert_close(auto(q, q, q, attn_mask=general_mask), qc.attention(q, q, q, attn_mask=general_mask))
    with pytest.raises(ValueError, match="backend must be one of sdpa, fused, auto"):
        qc.AttentionKernel("quest", 2, 16, backend="triton")
