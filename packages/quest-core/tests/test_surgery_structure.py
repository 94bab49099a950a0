"""swap_attention finds attention by structure: timm ConViT (GPSA, MHSA) is converted, XCiT's XCA is reported as
not supported, and hand-written attention is found whatever its name."""

import math

import pytest
import torch
from core_helpers import rand
from torch import nn

import quest_core as qc
from quest_core.surgery import probe_attention

timm = pytest.importorskip("timm")
from timm.models.cait import ClassAttn  # noqa: E402
from timm.models.convit import GPSA, MHSA, ConVit  # noqa: E402
from timm.models.xcit import XCA  # noqa: E402


def paths_of(model, *classes):
    return [path for path, m in model.named_modules() if type(m) in classes]


# ---- timm ConViT and XCiT ----------------------------------------------------------------------------------------

def test_convit_tiny_converts_every_gpsa_and_mhsa_and_softmax_keeps_outputs():
    torch.manual_seed(0)
    model = timm.create_model("convit_tiny", pretrained=False).eval()
    gpsa, mhsa = paths_of(model, GPSA), paths_of(model, MHSA)
    assert (len(gpsa), len(mhsa)) == (10, 2)
    x = rand(1, 3, 224, 224, seed=1)
    with torch.no_grad():
        before = model(x)
    report = qc.swap_attention(model, "softmax", strict=True)
    assert [path for path, _ in report.swapped] == gpsa + mhsa and not report.left, str(report)
    assert {cls for _, cls in report.swapped} == {"GPSA", "MHSA"}
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-5)
    qc.swap_attention(model, "quest", strict=True)
    assert type(model.blocks[0].attn).__name__ == "ConvitGPSA_quest" and model.blocks[0].attn.kernel.variant == "quest"
    with torch.no_grad():
        quest_out = model(x)
    assert torch.isfinite(quest_out).all() and not torch.allclose(quest_out, before, atol=0.0, rtol=1e-3)


def test_xcit_reports_every_xca_as_not_supported_and_strict_refuses():
    model = timm.create_model("xcit_nano_12_p16_224", pretrained=False).eval()
    xca, class_attn = paths_of(model, XCA), paths_of(model, ClassAttn)
    assert (len(xca), len(class_attn)) == (12, 2)
    with pytest.raises(ValueError, match=r"left 12 attention module\(s\) unconverted: blocks\.0\.attn \(XCA\)") as err:
        qc.swap_attention(model, "quest", strict=True)
    assert "cross-covariance" in str(err.value) and "channel x channel" in str(err.value)
    assert all(type(model.get_submodule(p)) is ClassAttn for p in class_attn)  # refused before anything changed
    x = rand(1, 3, 224, 224, seed=2)
    with torch.no_grad():
        before = model(x)
    with pytest.warns(UserWarning, match="cross-covariance"):
        report = qc.swap_attention(model, "softmax")
    assert [path for path, _ in report.swapped] == class_attn
    assert [(path, cls) for path, cls, _ in report.left] == [(p, "XCA") for p in xca]
    assert all(why.startswith("not supported") and "head dimension" in why for _, _, why in report.left)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-5)  # class attention swapped, XCA as is


# ---- converted modules against float64 references written from the papers' formulas -----------------------------

def quest_probs(q_bhnd, k_bhnd):
    """QUEST: softmax(q · (k/‖k‖)ᵀ), no scale."""
    return torch.softmax(q_bhnd @ (k_bhnd / k_bhnd.norm(dim=-1, keepdim=True)).transpose(-2, -1), dim=-1)


def split_heads(t_bnc, heads):
    b, n, c = t_bnc.shape
    return t_bnc.reshape(b, n, heads, c // heads).transpose(1, 2)


def merge_heads(t_bhnd):
    b, h, n, d = t_bhnd.shape
    return t_bhnd.transpose(1, 2).reshape(b, n, h * d)


def test_converted_mhsa_equals_float64_quest_attention():
    torch.manual_seed(0)
    attn = MHSA(32, num_heads=4, qkv_bias=True).double().eval()
    x = rand(2, 9, 32, dtype=torch.float64, seed=3)
    qc.swap_attention(attn, "quest", strict=True)
    q, k, v = (split_heads(t, 4) for t in nn.functional.linear(x, attn.qkv.weight, attn.qkv.bias).chunk(3, dim=-1))
    expected = nn.functional.linear(merge_heads(quest_probs(q, k) @ v), attn.proj.weight, attn.proj.bias)
    torch.testing.assert_close(attn(x), expected, atol=1e-12, rtol=1e-10)


def test_converted_gpsa_mixes_quest_content_with_timms_positional_attention_in_float64():
    torch.manual_seed(0)
    attn = GPSA(32, num_heads=4, qkv_bias=True, locality_strength=1.0).double().eval()
    attn.local_init()
    nn.init.normal_(attn.gating_param)  # gates away from σ(1): both branches weigh differently per head
    nn.init.normal_(attn.v.weight, std=0.2)
    x = rand(2, 16, 32, dtype=torch.float64, seed=4)
    qc.swap_attention(attn, "quest", strict=True)
    out = attn(x)
    q, k = (split_heads(t, 4) for t in nn.functional.linear(x, attn.qk.weight, attn.qk.bias).chunk(2, dim=-1))
    v = split_heads(nn.functional.linear(x, attn.v.weight, attn.v.bias), 4)
    side = 4  # the 16 tokens on a 4 x 4 grid: relative offsets (dx, dy, dx² + dy²)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    rows, cols = rows.flatten().double(), cols.flatten().double()
    dx, dy = cols[None, :] - cols[:, None], rows[None, :] - rows[:, None]
    rel_nn3 = torch.stack([dx, dy, dx ** 2 + dy ** 2], dim=-1)
    pos_nnh = nn.functional.linear(rel_nn3, attn.pos_proj.weight, attn.pos_proj.bias)
    pos_hnn = torch.softmax(pos_nnh.permute(2, 0, 1), dim=-1)
    gate_h11 = torch.sigmoid(attn.gating_param).view(4, 1, 1)
    mixed = (1 - gate_h11) * quest_probs(q, k) + gate_h11 * pos_hnn
    expected = nn.functional.linear(merge_heads(mixed @ v), attn.proj.weight, attn.proj.bias)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(attn.get_attention(x), mixed, atol=1e-12, rtol=1e-10)


def test_converted_class_attention_equals_float64_quest_attention():
    torch.manual_seed(0)
    attn = ClassAttn(32, num_heads=4, qkv_bias=True).double().eval()
    x = rand(2, 7, 32, dtype=torch.float64, seed=5)
    qc.swap_attention(attn, "quest", strict=True)
    q = split_heads(attn.q(x[:, :1]), 4)
    k, v = split_heads(attn.k(x), 4), split_heads(attn.v(x), 4)
    expected = attn.proj(merge_heads(quest_probs(q, k) @ v))
    torch.testing.assert_close(attn(x), expected, atol=1e-12, rtol=1e-10)


def test_small_convit_swap_trains_and_mhsa_attention_map_follows_the_variant():
    torch.manual_seed(0)
    model = ConVit(img_size=32, patch_size=8, embed_dim=8, depth=2, num_heads=4, num_classes=5,
                   local_up_to_layer=1, use_pos_embed=True)
    mhsa = model.blocks[1].attn
    x_bnc = rand(2, 16, 32, seed=6)
    dist_before = mhsa.get_attention_map(x_bnc)
    qc.swap_attention(model, "softmax", strict=True)
    torch.testing.assert_close(mhsa.get_attention_map(x_bnc), dist_before, atol=1e-6, rtol=1e-5)
    qc.swap_attention(model, "qknorm-hs", strict=True)
    assert not torch.allclose(mhsa.get_attention_map(x_bnc), dist_before)
    model.train()
    model(rand(2, 3, 32, 32, seed=7)).square().mean().backward()
    assert model.blocks[0].attn.kernel.q_gain.grad is not None and model.blocks[1].attn.kernel.q_gain.grad is not None


# ---- hand-written attention: found by structure, whatever its name --------------------------------------------

class MyBlock(nn.Module):
    """Attention with nothing attention-like in its class or attribute name."""

    def __init__(self, dim):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return self.out(self.drop(scores.softmax(dim=-1)) @ self.v(x))


class FusedMixer(nn.Module):
    """Attention through torch's fused kernel."""

    def __init__(self, dim):
        super().__init__()
        self.to_qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        return nn.functional.scaled_dot_product_attention(q, k, v)


class Classifier(nn.Module):
    """Softmax over a linear map and over a product with a weight: not attention."""

    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.prototypes = nn.Parameter(torch.randn(dim, 3))

    def forward(self, x):
        return self.fc(x).softmax(dim=-1) + (x @ self.prototypes).softmax(dim=-1).sum(-1, keepdim=True)


def test_hand_written_attention_is_found_by_structure_and_strict_refuses():
    model = nn.Sequential(nn.Linear(8, 16), MyBlock(16), FusedMixer(16), Classifier(16))
    with pytest.warns(UserWarning, match=r"left 2 attention module\(s\) unconverted: 1 \(MyBlock\), 2 \(FusedMixer\)"):
        report = qc.swap_attention(model, "quest")
    assert [(path, cls) for path, cls, _ in report.left] == [("1", "MyBlock"), ("2", "FusedMixer")]
    assert "softmax over a product of two activations" in report.left[0][2]
    assert "calls scaled_dot_product_attention" in report.left[1][2]
    with pytest.raises(ValueError, match=r"unconverted: 1 \(MyBlock\)"):
        qc.swap_attention(model, "quest", strict=True)


class CrossAttentionBlock(nn.Module):
    """Named like attention, but only wraps the attention (and an MLP)."""

    def __init__(self, dim):
        super().__init__()
        self.inner, self.mlp = MyBlock(dim), nn.Linear(dim, dim)

    def forward(self, x):
        return self.mlp(x + self.inner(x))


def test_a_named_block_around_found_attention_is_not_listed_twice():
    model = nn.Sequential(CrossAttentionBlock(8), nn.MultiheadAttention(8, 2))
    with pytest.warns(UserWarning, match=r"left 1 attention module\(s\) unconverted: 0\.inner \(MyBlock\);"):
        report = qc.swap_attention(model, "quest")
    assert report.swapped == [("1", "MultiheadAttention")]


def test_no_attention_no_report():
    model = nn.Sequential(nn.Linear(8, 16), Classifier(16), nn.Sequential(nn.Linear(16, 16), nn.GELU()))
    report = qc.swap_attention(model, "quest", strict=True)
    assert not report.left and not report.swapped


class Unprobed(nn.Module):
    """An attention whose forward takes more than tokens (the probe cannot run it)."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, height: int, width: int):
        return x.reshape(x.shape[0], height, width, -1)


class Host(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Unprobed(8)  # the attribute name and the q/k/v projection give it away
        self.mixer = Unprobed(8)  # neither the name nor a probe: not reported

    def forward(self, x):
        return self.attn(x, 2, 2) + self.mixer(x, 2, 2)


def test_attention_attribute_holding_qkv_is_reported_by_name():
    model = Host()
    with pytest.warns(UserWarning):
        report = qc.swap_attention(model, "quest")
    assert [(path, cls) for path, cls, _ in report.left] == [("attn", "Unprobed")]
    assert "attribute 'attn'" in report.left[0][2] and "q/k/v projections" in report.left[0][2]


def test_the_probe_leaves_rng_training_flags_weights_and_buffers_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), MyBlock(16), GPSA(16, num_heads=4), nn.BatchNorm1d(4))
    model.train()
    model[0].eval()
    flags = [m.training for m in model.modules()]
    buffers = dict(model.named_buffers())  # GPSA's forward re-assigns its (non-persistent) relative-position cache
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    found = probe_attention(model)
    assert found == {"1": "softmax over a product of two activations (q·kᵀ)",
                     "2": "softmax over a product of two activations (q·kᵀ)"}
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == flags and model.training and not model[0].training
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())  # BatchNorm statistics included
    assert all(b is buffers[name] for name, b in model.named_buffers())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
