"""MultiheadAttention is a drop-in for torch's; swap_attention keeps outputs with softmax on five host models."""

import pytest
import torch
from torch import nn

import quest_core as qc
from quest_core import MultiheadAttention


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


MHA_CONFIGS = {
    "default_seq_first": {},
    "batch_first": {"batch_first": True},
    "cross_kdim_vdim": {"kdim": 6, "vdim": 10, "batch_first": True},
    "bias_kv_zero_attn": {"add_bias_kv": True, "add_zero_attn": True},
    "no_bias": {"bias": False, "batch_first": True},
}


def mha_inputs(cfg, batched=True, seed=0):
    b, lq, lk, e = 3, 5, 7, 16
    kdim, vdim = cfg.get("kdim", e), cfg.get("vdim", e)
    shape = (lambda l, d: (b, l, d)) if cfg.get("batch_first") else (lambda l, d: (l, b, d))
    if not batched:
        shape = lambda l, d: (l, d)  # noqa: E731
    return rand(*shape(lq, e), seed=seed), rand(*shape(lk, kdim), seed=seed + 1), rand(*shape(lk, vdim), seed=seed + 2)


def pair(cfg):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, **cfg).eval()
    if ref.bias_k is not None:
        nn.init.normal_(ref.bias_k), nn.init.normal_(ref.bias_v)
    ours = MultiheadAttention(16, 4, **cfg, variant="softmax").eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("cfg", MHA_CONFIGS)
@pytest.mark.parametrize("masks", ["none", "padding_bool", "padding_float", "attn2d_bool", "attn3d_float", "both"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_mha_softmax_matches_torch(cfg, masks, need_weights, average):
    cfg = MHA_CONFIGS[cfg]
    ref, ours = pair(cfg)
    q, k, v = mha_inputs(cfg)
    kw = {}
    if masks in ("padding_bool", "both"):
        kw["key_padding_mask"] = torch.tensor([[False] * 7, [False] * 4 + [True] * 3, [False] + [True] * 6])
    if masks == "padding_float":
        kw["key_padding_mask"] = rand(3, 7, seed=5)
    if masks in ("attn2d_bool", "both"):
        kw["attn_mask"] = torch.ones(5, 7, dtype=torch.bool).triu(1)  # True = masked out (torch MHA semantics)
    if masks == "attn3d_float":
        kw["attn_mask"] = rand(3 * 4, 5, 7, seed=6)
    out_ref, w_ref = ref(q, k, v, need_weights=need_weights, average_attn_weights=average, **kw)
    out, w = ours(q, k, v, need_weights=need_weights, average_attn_weights=average, **kw)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5)
    else:
        assert w is None and w_ref is None


def test_mha_unbatched_and_causal_hint():
    ref, ours = pair({})
    q, k, v = mha_inputs({}, batched=False)
    torch.testing.assert_close(ours(q, k, v)[0], ref(q, k, v)[0], atol=1e-5, rtol=1e-5)
    x = rand(6, 3, 16, seed=3)
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    expected = ref(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    torch.testing.assert_close(ours(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x, x, x, is_causal=True, need_weights=False)[0], expected, atol=1e-5, rtol=1e-5)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    expected = ref(x, x, x, attn_mask=causal, key_padding_mask=pad, is_causal=True)[0]
    torch.testing.assert_close(ours(x, x, x, key_padding_mask=pad, is_causal=True)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", qc.list_variants())
def test_mha_variant_is_projection_then_kernel(variant):
    """A non-softmax MHA equals: torch's projections, the variant's kernel, torch's output projection."""
    mha = MultiheadAttention(16, 4, batch_first=True, variant=variant).eval()
    qc.link_elliptical(mha)  # one layer: the elliptical metric is M = I
    x = rand(2, 5, 16, seed=8)
    q, k, v = (nn.functional.linear(x, w, b) for w, b in zip(mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)))
    heads = lambda t: t.view(2, 5, 4, 4).transpose(1, 2)  # noqa: E731
    out = mha.kernel(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(mha(x, x, x, need_weights=False)[0], mha.out_proj(out))


# ---- swap_attention on five host models -------------------------------------------------------------------------

def torchvision_vit():
    from torchvision.models import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64)
    nn.init.normal_(model.heads.head.weight)  # torchvision zero-initialises the head: outputs would all be 0
    return model, ((rand(2, 3, 32, 32, seed=1),), {})


def torchaudio_conformer():
    from torchaudio.models import Conformer

    model = Conformer(input_dim=32, num_heads=4, ffn_dim=64, num_layers=2, depthwise_conv_kernel_size=3)
    return model, ((rand(3, 11, 32, seed=2), torch.tensor([11, 7, 4])), {})


def transformer_encoder():
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)
    pad = torch.tensor([[False] * 9, [False] * 6 + [True] * 3])
    return model, ((rand(2, 9, 32, seed=3),), {"src_key_padding_mask": pad})


def transformer_decoder():
    layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0)  # seq-first, self- and cross-attention
    model = nn.TransformerDecoder(layer, num_layers=2)
    tgt, memory = rand(6, 2, 32, seed=4), rand(9, 2, 32, seed=5)
    return model, ((tgt, memory), {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(6), "tgt_is_causal": True})


def timm_vit():
    import timm

    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=10)
    return model, ((rand(2, 3, 32, 32, seed=6),), {})


HOSTS = {"torchvision_vit": (torchvision_vit, 2), "torchaudio_conformer": (torchaudio_conformer, 2),
         "nn_transformer_encoder": (transformer_encoder, 2), "nn_transformer_decoder": (transformer_decoder, 4),
         "timm_vit": (timm_vit, 2)}


def first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_swap_softmax_keeps_outputs(host, mode):
    build, n_attention = HOSTS[host]
    torch.manual_seed(0)
    model, (args, kwargs) = build()
    model.train(mode == "train")
    with torch.no_grad():  # no_grad + eval is where torch's native fast paths would kick in
        before = first(model(*args, **kwargs))
        n_params = sum(p.numel() for p in model.parameters())
        report = qc.swap_attention(model, "softmax")
        after = first(model(*args, **kwargs))
    if host == "nn_transformer_encoder":  # torch's nested-tensor fast path zeroes padded positions: compare the rest
        keep = ~kwargs["src_key_padding_mask"]
        before, after = before[keep], after[keep]
    assert len(report.swapped) == n_attention and not report.left, str(report)
    assert sum(p.numel() for p in model.parameters()) == n_params
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5, equal_nan=True)

    report = qc.swap_attention(model, "quest")  # re-target the swapped modules: outputs must now change
    assert len(report.swapped) == n_attention
    with torch.no_grad():
        quest_out = first(model(*args, **kwargs))
    if host == "nn_transformer_encoder":
        quest_out = quest_out[keep]
    assert torch.isfinite(quest_out[~torch.isnan(before)]).all()
    assert not torch.allclose(quest_out, before, equal_nan=True)


def test_swap_keeps_weights_and_counts_learnable_scales():
    model, _ = timm_vit()
    qkv = model.blocks[0].attn.qkv.weight
    report = qc.swap_attention(model, "qknorm-hs")
    assert model.blocks[0].attn.qkv.weight is qkv
    assert {n for n, _ in model.named_parameters() if "kernel" in n} == {"blocks.0.attn.kernel.q_gain", "blocks.1.attn.kernel.q_gain"}
    assert "2 swapped, 0 left" in str(report)


def test_swap_reports_what_it_cannot_convert():
    class MyAttention(nn.Module):
        def forward(self, x):
            return x

    model = nn.Sequential(MyAttention(), nn.MultiheadAttention(8, 2))
    with pytest.warns(UserWarning, match=r"left 1 attention module\(s\) unconverted: 0 \(MyAttention\)"):
        report = qc.swap_attention(model, "quest")
    assert report.swapped == [("1", "MultiheadAttention")]
    assert report.left[0][:2] == ("0", "MyAttention") and "no swap rule" in report.left[0][2]
    strict_model = nn.Sequential(MyAttention(), nn.MultiheadAttention(8, 2))
    with pytest.raises(ValueError, match="unconverted: 0 \\(MyAttention\\)"):
        qc.swap_attention(strict_model, "quest", strict=True)
    assert type(strict_model[1]) is nn.MultiheadAttention  # refused before anything changed


def timm_swin():
    from timm.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2, 1), num_heads=(2, 4),
                            num_classes=5).eval()
    return model, rand(2, 3, 32, 32)


def timm_eva():
    from timm.models.eva import Eva

    torch.manual_seed(0)
    model = Eva(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5, use_rot_pos_emb=True,
                qkv_fused=False, swiglu_mlp=True).eval()
    return model, rand(2, 3, 32, 32)


@pytest.mark.parametrize("host", [timm_swin, timm_eva])
def test_swin_and_eva_attention_are_swapped_keeping_outputs(host):
    model, x = host()
    with torch.no_grad():
        before = model(x)
    report = qc.swap_attention(model, "softmax", strict=True)
    assert len(report.swapped) == (3 if host is timm_swin else 2) and not report.left
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-5)  # shifted windows and rope included
    qc.swap_attention(model, "quest")
    with torch.no_grad():
        assert not torch.allclose(model(x), before, atol=0.0, rtol=1e-3)
    qc.swap_attention(model, "qknorm-hs")  # re-swapping renames the class and trains
    attn = next(m for m in model.modules() if hasattr(m, "kernel"))
    assert type(attn).__name__.endswith("_qknorm_hs") and attn.kernel.variant == "qknorm-hs"
    model.train()
    model(x).square().mean().backward()
    assert attn.kernel.q_gain.grad is not None


def test_reswapped_timm_vit_layers_get_the_new_class():
    model, _ = timm_vit()
    qc.swap_attention(model, "quest")
    qc.swap_attention(model, "qknorm")
    assert type(model.blocks[0].attn) is qc.timm_attn_layer("qknorm")


def test_timm_attn_layer_builds_a_quest_vit():
    import timm

    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=10,
        attn_layer=qc.timm_attn_layer("quest"))
    assert model.blocks[1].attn.kernel.variant == "quest"
    out = model(rand(2, 3, 32, 32))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    import pickle

    assert type(pickle.loads(pickle.dumps(model)).blocks[0].attn) is qc.timm_attn_layer("quest")


@pytest.mark.parametrize("variant", ["softmax", "quest"])
def test_transformer_block_is_pre_norm_attention_then_mlp_and_respects_causality(variant):
    from quest_core import TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(16, 4, variant, mlp_ratio=2.0).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    h = x + block.attn(block.norm1(x), is_causal=True)
    torch.testing.assert_close(block(x, is_causal=True), h + block.mlp(block.norm2(h)))
    changed = x.clone()
    changed[:, 5:] += 1.0  # a later token cannot change an earlier output
    torch.testing.assert_close(block(changed, is_causal=True)[:, :5], block(x, is_causal=True)[:, :5])
