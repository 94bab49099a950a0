"""quest_core.attention behaves as torch's SDPA on what torch accepts: masks, causal, shapes (variant softmax is
SDPA itself, so these compare exactly; quest is checked against SDPA on the normalised keys)."""

import pytest
import torch
import torch.nn.functional as F

import quest_core as qc
from core_helpers import rand


def unit_keys(k):
    return k / k.norm(dim=-1, keepdim=True)


CASES = {
    "2-D inputs": lambda: (rand(5, 8, seed=1), rand(6, 8, seed=2), rand(6, 4, seed=3), {}),
    "3-D inputs": lambda: (rand(2, 5, 8, seed=1), rand(2, 6, 8, seed=2), rand(2, 6, 4, seed=3), {}),
    "batch-broadcast k/v": lambda: (rand(3, 2, 5, 8, seed=1), rand(1, 2, 6, 8, seed=2), rand(1, 2, 6, 4, seed=3), {}),
    "head-broadcast k/v": lambda: (rand(3, 2, 5, 8, seed=1), rand(3, 1, 6, 8, seed=2), rand(3, 1, 6, 4, seed=3), {}),
    "fewer dims in q": lambda: (rand(2, 5, 8, seed=1), rand(3, 2, 6, 8, seed=2), rand(3, 2, 6, 4, seed=3), {}),
    "bool mask and causal": lambda: (rand(2, 2, 6, 8, seed=1), rand(2, 2, 6, 8, seed=2), rand(2, 2, 6, 4, seed=3),
                                     {"attn_mask": rand(6, 6, seed=4) > -0.3, "is_causal": True}),
    "float mask and causal": lambda: (rand(2, 2, 6, 8, seed=1), rand(2, 2, 6, 8, seed=2), rand(2, 2, 6, 4, seed=3),
                                      {"attn_mask": rand(6, 6, seed=4), "is_causal": True}),
}


def torch_sdpa(q, k, v, attn_mask=None, is_causal=False, **kwargs):
    """torch's SDPA; a mask with is_causal as its fused CPU kernel reads the pair (both apply), which its other
    paths refuse."""
    if attn_mask is not None and is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn_mask = attn_mask & causal if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~causal, -torch.inf)
        is_causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)


def test_torch_fused_cpu_kernel_applies_a_mask_and_causal_together():
    q, k, v = (rand(2, 2, 6, 8, seed=s) for s in range(3))
    mask = rand(6, 6, seed=4) > -0.3
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True),
                               torch_sdpa(q, k, v, attn_mask=mask, is_causal=True))


@pytest.mark.parametrize("case", CASES)
def test_shapes_and_masks_as_torch(case):
    q, k, v, kwargs = CASES[case]()
    for requires_grad in (False, True):
        q, k, v = (t.detach().requires_grad_(requires_grad) for t in (q, k, v))
        torch.testing.assert_close(qc.attention(q, k, v, variant="softmax", **kwargs), torch_sdpa(q, k, v, **kwargs))
        torch.testing.assert_close(qc.attention(q, k, v, variant="quest", **kwargs),
                                   torch_sdpa(q, unit_keys(k), v, scale=1.0, **kwargs))


def test_mask_and_causal_both_apply_in_the_materialised_path_too():
    q, k, v = (rand(1, 2, 6, 8, seed=s) for s in range(3))
    keep = rand(6, 6, seed=4) > -0.3
    keep[:, 0] = True
    kernel = qc.AttentionKernel("quest", 2, 8)
    out, probs = kernel(q, k, v, attn_mask=keep, is_causal=True, need_weights=True)
    both = keep & torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(probs > 0, both.expand_as(probs))
    torch.testing.assert_close(out, kernel(q, k, v, attn_mask=both))


def test_a_float_mask_keeps_its_precision_with_bfloat16_inputs():
    """torch adds a float32 bias to bfloat16 logits without rounding it to bfloat16 first: so must we."""
    q, k, v = (rand(2, 2, 16, 8, seed=s, dtype=torch.float64) for s in range(3))
    bias = rand(16, 16, seed=5, dtype=torch.float32) * 3
    ours = qc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), attn_mask=bias, variant="softmax")
    torch_out = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), attn_mask=bias)
    assert torch.equal(ours, torch_out)
    rounded = qc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), attn_mask=bias.bfloat16(), variant="softmax")
    reference = F.scaled_dot_product_attention(q.bfloat16().double(), k.bfloat16().double(), v.bfloat16().double(),
                                               attn_mask=bias.double())
    assert (ours.double() - reference).abs().max() <= (rounded.double() - reference).abs().max()
