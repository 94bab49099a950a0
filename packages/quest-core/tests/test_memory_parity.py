"""Memory at parity with SDPA where users train: a timm ViT-S block stack (fused qkv), swapped to each variant.

The transformed q̂/k̂ are never stored: SDPA's saved copy is recomputed in backward from the raw q/k (alive anyway
in the qkv buffer) and per-row factors. Byte counts, not timings: they hold on any machine.
"""

import copy

import pytest
import torch

import quest_core as qc
from quest_core.functional import RecomputeSaved, transform_qk

timm = pytest.importorskip("timm")

PLAIN = ["quest", "qnorm"]
GAINED = ["qknorm", "qknorm-hs", "qknorm-ds", "cosine", "qk-layernorm", "elliptical", "elliptical-quest"]


@pytest.fixture(scope="module")
def vit_blocks():
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", pretrained=False, depth=2).blocks


def measure(blocks, variant, dtype):
    blocks = copy.deepcopy(blocks).to(dtype)
    if variant != "stock":
        qc.swap_attention(blocks, variant)
    x = torch.randn(2, 197, 384, generator=torch.Generator().manual_seed(1), dtype=dtype)
    saved = qc.saved_bytes(lambda: blocks(x.clone().requires_grad_()))
    peak = qc.peak_bytes(lambda: blocks(x.clone().requires_grad_()).float().square().sum().backward())
    return saved, peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vit_small_blocks_save_and_peak_as_the_stock_blocks(vit_blocks, dtype):
    stock_saved, stock_peak = measure(vit_blocks, "stock", dtype)
    for variant in PLAIN + GAINED:
        saved, peak = measure(vit_blocks, variant, dtype)
        limit = 1.01 if variant in PLAIN else 1.02
        assert saved <= limit * stock_saved, f"{variant}: saved {saved / stock_saved:.4f}x the stock blocks"
        assert peak <= 1.10 * stock_peak, f"{variant}: allocator peak {peak / stock_peak:.3f}x the stock blocks"


def test_the_normalised_keys_are_not_stored():
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    spec = qc.get_variant("quest")

    def call(recompute):
        saved = RecomputeSaved() if recompute else None
        q_hat, k_hat = transform_qk(spec, q, k, saved=saved)
        if not recompute:  # SDPA keeps k̂ itself
            return torch.nn.functional.scaled_dot_product_attention(q_hat, k_hat, v, scale=1.0)
        with saved.hooks():
            return torch.nn.functional.scaled_dot_product_attention(q_hat, k_hat, v, scale=1.0)

    k_bytes = k.numel() * k.element_size()
    assert qc.saved_bytes(lambda: call(False)) - qc.saved_bytes(lambda: call(True)) == k_bytes  # k̂, exactly
    out_recomputed, out_stored = call(True), call(False)
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v)) for out in (out_recomputed, out_stored)]
    for ours, ref in zip(*grads):
        assert torch.equal(ours, ref)  # recomputation is bit for bit


def test_a_key_modified_in_place_before_backward_is_an_error():
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    k_leaf = k.clone().requires_grad_()
    k_used = k_leaf * 1.0
    out = qc.attention(q, k_used, v, variant="quest")
    with torch.no_grad():
        k_used.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified"):
        out.sum().backward()
