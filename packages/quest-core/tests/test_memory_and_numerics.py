"""Memory saved for backward (parity with SDPA), half-precision need_weights, fully masked rows, folded gains."""

import math

import pytest
import torch
import torch.nn.functional as F

import quest_core as qc
from core_helpers import rand
from core_helpers import standalone_kernel as AttentionKernel
from quest_core.functional import l2_normalize


def saved_storage_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for backward while ``fn`` runs (a structural count)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("variant", qc.list_variants())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_for_backward_is_within_10_percent_of_sdpa(variant, dtype):
    q, k, v = (rand(2, 4, 64, 32, dtype=dtype, seed=s).requires_grad_() for s in range(3))
    kernel = AttentionKernel(variant, 4, 32, dtype=dtype)
    ours = saved_storage_bytes(lambda: kernel(q, k, v))
    base = saved_storage_bytes(lambda: F.scaled_dot_product_attention(q, k, v))
    assert ours <= 1.10 * base, f"{variant}: {ours / base:.2f}x SDPA's saved bytes"


@pytest.mark.parametrize("shape", [(1,), (3, 1, 1), (8,)])
def test_folded_gain_matches_autograd_of_the_unfolded_formula(shape):
    x = rand(2, 3, 5, 8, dtype=torch.float64, seed=1).requires_grad_()
    gain = (rand(*shape, dtype=torch.float64, seed=2) + 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, g: l2_normalize(a, gain=g), (x, gain))
    gain_zero = gain.detach().clone()
    gain_zero.view(-1)[0] = 0.0  # x/‖x‖ cannot be recovered from y there: the fallback path keeps it
    assert torch.autograd.gradcheck(lambda a, g: l2_normalize(a, gain=g), (x, gain_zero.requires_grad_()))


@pytest.mark.parametrize("variant", ["quest", "qknorm-hs", "qknorm-ds"])
def test_bfloat16_gradients_follow_the_float32_ones(variant):
    q, k, v = (rand(2, 2, 16, 32, seed=s) * 3 for s in (3, 4, 5))
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        kernel = AttentionKernel(variant, 2, 32, dtype=dtype)
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        kernel(*leaves).square().sum().backward()
        grads[dtype] = [t.grad.float() for t in leaves]
    for ours, ref in zip(grads[torch.bfloat16], grads[torch.float32]):
        assert (ours - ref).norm() / ref.norm() < 0.05


def test_need_weights_in_float16_does_not_overflow_where_torch_does_not():
    q, k, v = rand(1, 2, 4, 64, seed=6) * 40, rand(1, 2, 4, 64, seed=7) * 40, rand(1, 2, 4, 64, seed=8)
    q[..., :] = q.abs()  # q·k ≈ 64 · 1600 > 65504 (fp16 max) before the 1/8 scale, not after
    k[..., :] = k.abs()
    kernel = AttentionKernel("softmax", 2, 64, dtype=torch.float16)
    out, probs = kernel(q.half(), k.half(), v.half(), need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()
    torch.testing.assert_close(out.float(), F.scaled_dot_product_attention(q, k, v), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("variant", qc.list_variants())
def test_a_fully_masked_row_gives_zero_in_both_paths(variant):
    q, k, v = rand(1, 2, 3, 8, seed=9), rand(1, 2, 4, 8, seed=10), rand(1, 2, 4, 8, seed=11)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    kernel = AttentionKernel(variant, 2, 8)
    fused = kernel(q, k, v, attn_mask=mask)
    explicit, probs = kernel(q, k, v, attn_mask=mask, need_weights=True)
    for out in (fused, explicit):
        assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()
    assert (probs[:, :, 1] == 0).all()
    torch.testing.assert_close(explicit, fused)


@pytest.mark.parametrize("variant", ["qknorm", "qknorm-hs", "qknorm-ds"])
def test_a_checkpoint_without_gains_loads_strictly_with_their_init(variant):
    from torch import nn

    torch.manual_seed(0)
    plain = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    state = plain.state_dict()
    swapped = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    qc.swap_attention(swapped, variant)
    fresh = {k: v.clone() for k, v in swapped.state_dict().items() if "gain" in k}
    for p in swapped.parameters():
        p.data.add_(1.0)  # trained away from the init
    swapped.load_state_dict(state, strict=True)
    for name, value in fresh.items():
        torch.testing.assert_close(swapped.state_dict()[name], value)
    assert all(torch.equal(swapped.state_dict()[k], v) for k, v in state.items())


def test_gains_for_other_heads_or_dims_fail_clearly():
    kernel = AttentionKernel("qknorm-hs", 4, 8)
    q = rand(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"parameters for 4 heads of dim 8, but the query has 2 heads of dim 8"):
        kernel(q, q, q)
    AttentionKernel("quest", 4, 8)(q, q, q)  # no gains: any heads and dims


def test_cosine_is_swin_v2_attention_written_out():
    """Swin-v2: logit = min(τ_h, 100) · cos(q, k) with τ_h = exp(logit_scale_h), initialised to 10."""
    q, k, v = rand(2, 3, 5, 8, dtype=torch.float64, seed=1), rand(2, 3, 6, 8, dtype=torch.float64, seed=2), \
        rand(2, 3, 6, 8, dtype=torch.float64, seed=3)
    kernel = AttentionKernel("cosine", 3, 8, dtype=torch.float64)
    torch.testing.assert_close(kernel.logit_scale.exp().flatten(), torch.full((3,), 10.0, dtype=torch.float64))
    with torch.no_grad():
        kernel.logit_scale.copy_(torch.tensor([1.0, 3.0, 6.0], dtype=torch.float64).view(3, 1, 1))  # e^6 > 100
    tau = torch.tensor([math.e, math.exp(3.0), 100.0], dtype=torch.float64).view(1, 3, 1, 1)
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    expected = (tau * cos).softmax(-1) @ v
    torch.testing.assert_close(kernel(q, k, v), expected)


def test_qk_layernorm_is_torch_layer_norm_then_scaled_attention():
    q, k, v = (rand(2, 2, 7, 16, dtype=torch.float64, seed=s) * 3 + 1 for s in (4, 5, 6))
    kernel = AttentionKernel("qk-layernorm", 2, 16, dtype=torch.float64)
    with torch.no_grad():
        for p in kernel.parameters():
            p.uniform_(0.5, 1.5)
    q_ln = F.layer_norm(q, (16,), kernel.q_ln_weight, kernel.q_ln_bias, eps=1e-6)
    k_ln = F.layer_norm(k, (16,), kernel.k_ln_weight, kernel.k_ln_bias, eps=1e-6)
    torch.testing.assert_close(kernel(q, k, v), F.scaled_dot_product_attention(q_ln, k_ln, v))
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    kernel(q64, k64, v64).square().sum().backward()
    q_ref, k_ref, v_ref = (t.clone().requires_grad_() for t in (q, k, v))
    ln = [F.layer_norm(x, (16,), w, b, eps=1e-6) for x, w, b in (
        (q_ref, kernel.q_ln_weight, kernel.q_ln_bias), (k_ref, kernel.k_ln_weight, kernel.k_ln_bias))]
    F.scaled_dot_product_attention(*ln, v_ref).square().sum().backward()
    for ours, ref in ((q64, q_ref), (k64, k_ref), (v64, v_ref)):
        torch.testing.assert_close(ours.grad, ref.grad)


@pytest.fixture
def toy_variant():
    from quest_core import variants

    toy = qc.register_variant(qc.Variant(
        "toy-kscale", qc.Side(), qc.Side("l2", gain="k_temperature"), "one", "unit keys times a learned scale",
        "a test", (qc.Param("k_temperature", "head", lambda d, init: 2.0, weight_decay=True),)))
    yield toy
    variants._VARIANTS.pop(toy.name)


def test_a_registered_variant_works_everywhere_from_its_declaration(toy_variant):
    from torch import nn

    q, k, v = rand(1, 2, 4, 8, seed=8), rand(1, 2, 5, 8, seed=9), rand(1, 2, 5, 8, seed=10)
    kernel = AttentionKernel("toy-kscale", 2, 8)
    expected = F.scaled_dot_product_attention(q, 2.0 * F.normalize(k, dim=-1), v, scale=1.0)
    torch.testing.assert_close(kernel(q, k, v), expected)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    qc.swap_attention(layer, "toy-kscale")
    assert id(layer.self_attn.kernel.k_temperature) not in qc.no_weight_decay(layer)  # it asked for weight decay
    qc.swap_attention(layer, "qknorm")
    assert id(layer.self_attn.kernel.q_gain) in qc.no_weight_decay(layer)
    with pytest.raises(ValueError, match="already registered"):
        qc.register_variant(toy_variant)
