"""The elliptical variants' state: the metric estimated from consecutive layers' values, the chain, the QUEST form."""

import math

import pytest
import torch
from torch import nn

import quest_core as qc
from quest_core.elliptical import METRIC_FLOOR, MetricChain


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_the_metric_is_the_mean_absolute_change_of_the_values_normalised_by_its_maximum():
    v1, v2 = rand(2, 3, 5, 4, seed=1), rand(2, 3, 5, 4, seed=2)
    chain = MetricChain()
    assert torch.equal(chain.next_metric(v1, 4), torch.ones(2, 3, 1, 4))  # the first layer: M = I
    s = chain.next_metric(v2, 4)
    for b in range(2):  # one metric per sequence and head
        for h in range(3):
            m = [sum(abs(v2[b, h, n, d] - v1[b, h, n, d]).item() for n in range(5)) / 5 for d in range(4)]
            expected = [math.sqrt(max(x / max(m), METRIC_FLOOR)) for x in m]
            torch.testing.assert_close(s[b, h, 0], torch.tensor(expected))
    assert torch.equal(chain.next_metric(rand(2, 3, 7, 4), 4), torch.ones(2, 3, 1, 4))  # another shape: no estimate
    chain.next_metric(rand(2, 3, 7, 4), 4)
    assert torch.equal(chain.next_metric(rand(2, 3, 7, 4), 6), torch.ones(2, 3, 1, 6))  # values narrower than q, k
    same = rand(2, 3, 7, 4, seed=9)
    chain.next_metric(same, 4)
    assert torch.equal(chain.next_metric(same.clone(), 4), torch.ones(2, 3, 1, 4))  # values unchanged: M = I


def test_keys_no_query_can_see_do_not_enter_the_metric_and_float64_stays_float64():
    v1, v2 = rand(1, 2, 6, 4, seed=1).double(), rand(1, 2, 6, 4, seed=2).double()
    padding_mask = torch.tensor([True, True, True, True, False, False])  # keys 4, 5 are padding
    chain = MetricChain()
    chain.next_metric(v1, 4)
    from quest_core.elliptical import visible_keys

    attn_mask = padding_mask.expand(6, 6)  # (Lq, Lk): every query sees keys 0-3 only
    s = chain.next_metric(v2, 4, visible_keys(attn_mask))
    assert s.dtype == torch.float64
    m = (v2 - v1).abs()[..., :4, :].mean(-2)  # only the visible keys
    torch.testing.assert_close(s[..., 0, :], (m / m.amax(-1, keepdim=True)).clamp_min(METRIC_FLOOR).sqrt(),
                               rtol=1e-12, atol=1e-12)
    additive = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~attn_mask, float("-inf"))
    torch.testing.assert_close(visible_keys(additive), visible_keys(attn_mask))


def test_elliptical_logits_are_the_mahalanobis_dot_product_and_the_quest_form_normalises_keys_in_it():
    q, k, v = rand(1, 2, 3, 4, seed=3), rand(1, 2, 6, 4, seed=4), rand(1, 2, 6, 4, seed=5)
    m = torch.rand(2, 1, 4, generator=torch.Generator().manual_seed(6)) + 0.1
    for variant, expected_logits in (
        ("elliptical", torch.einsum("bhid,hd,bhjd->bhij", q, m[:, 0], k) / 2.0),
        ("elliptical-quest", torch.einsum("bhid,hd,bhjd->bhij", q, m[:, 0], k)
         / torch.einsum("bhjd,hd,bhjd->bhj", k, m[:, 0], k).sqrt()[:, :, None, :]),
    ):
        kernel = qc.AttentionKernel(variant, 2, 4)
        kernel.metric_chain = type("Fixed", (), {"next_metric": lambda self, v_, d_, visible=None: m.sqrt()})()
        torch.testing.assert_close(kernel(q, k, v), expected_logits.softmax(-1) @ v)


def test_a_linked_model_restarts_its_chain_at_every_forward_and_estimates_from_the_second_layer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    report = qc.swap_attention(model, "elliptical")
    assert any("metric chain" in note for note in report.notes)
    x = rand(2, 5, 16, seed=7)
    first = model(x)
    torch.testing.assert_close(model(x), first)  # nothing leaks from one forward into the next
    metrics = [blk.self_attn.kernel._metric for blk in model.layers]
    assert torch.equal(metrics[0], torch.ones(2, 2, 1, 8))  # (batch, heads, 1, head dim)
    assert all(not torch.allclose(m, torch.ones_like(m)) for m in metrics[1:])
    first.sum().backward()  # the metric is detached: gradients flow through q, k, v as usual
    assert model.layers[0].self_attn.in_proj_weight.grad is not None


def test_a_kernel_on_its_own_is_its_own_model():
    q, k = rand(1, 2, 3, 4), rand(1, 2, 3, 4, seed=1)
    for call in (lambda kernel: kernel(q, k, q), lambda kernel: kernel.forward(q, k, q)):
        kernel = qc.AttentionKernel("elliptical", 2, 4)
        torch.testing.assert_close(call(kernel), call(kernel))  # one layer, restarted at each call: M = I
        assert kernel.metric_chain is kernel._quest_metric_chain
        assert torch.equal(kernel._metric, torch.ones(1, 2, 1, 4))
    with pytest.raises(ValueError, match="learnable parameters or state, so it is a module"):
        qc.attention(q, q, q, variant="elliptical-quest")


def test_a_linked_model_pickles_and_its_deep_copy_has_its_own_chain():
    import copy
    import pickle

    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0), 2,
                                  enable_nested_tensor=False).eval()
    qc.swap_attention(model, "elliptical-quest")
    x = rand(2, 5, 16, seed=8)
    expected = model(x)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(clone(x), expected)
        kernels = [layer.self_attn.kernel for layer in clone.layers]
        assert kernels[0].metric_chain is kernels[1].metric_chain is clone._quest_metric_chain
        assert clone._quest_metric_chain is not model._quest_metric_chain


class TwoCausalLayers(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.first, self.second = qc.AttentionKernel(variant, 2, 4), qc.AttentionKernel(variant, 2, 4)

    def forward(self, x):
        h = self.first(x, x, x, is_causal=True)
        return self.second(h, h, h * 2 + 1, is_causal=True)


@pytest.mark.parametrize("variant", ["elliptical", "elliptical-quest"])
def test_causal_calls_never_see_statistics_of_later_tokens(variant):
    model = TwoCausalLayers(variant).train()
    x = rand(2, 2, 6, 4, seed=11)
    model(rand(2, 2, 6, 4, seed=12))  # a training call: the layers now hold an estimate from it
    state = [k._causal_metric.clone() for k in (model.first, model.second)]
    assert not torch.allclose(state[1], torch.ones_like(state[1]))  # a real metric is in use
    changed = x.clone()
    changed[:, :, 4:] += 3.0  # later tokens differ
    outs = []
    for inputs in (x, changed):
        model.first._causal_metric, model.second._causal_metric = (s.clone() for s in state)
        outs.append(model(inputs))
    torch.testing.assert_close(outs[1][:, :, :4], outs[0][:, :, :4])  # earlier positions: identical
    model.eval()
    frozen = model.second._causal_metric.clone()
    model(x)
    assert torch.equal(model.second._causal_metric, frozen)  # evaluation does not update the estimate


# ---- no wiring: kernels link the model they run in ----------------------------------------------------------------

class Blocks(nn.Module):
    """quest-core blocks with no elliptical wiring; ``order`` is the order the forward calls them in."""

    def __init__(self, variant="elliptical", depth=3, order=None, checkpointed=False, reentrant=False, causal=False):
        super().__init__()
        self.blocks = nn.ModuleList(qc.TransformerBlock(16, 2, variant) for _ in range(depth))
        self.order = order or list(range(depth))
        self.checkpointed, self.reentrant, self.causal = checkpointed, reentrant, causal

    def forward(self, x_bld):
        for i in self.order:
            if self.checkpointed:
                x_bld = torch.utils.checkpoint.checkpoint(self.blocks[i], x_bld, None, self.causal,
                                                          use_reentrant=self.reentrant)
            else:
                x_bld = self.blocks[i](x_bld, None, self.causal)
        return x_bld


def kernels(model):
    return [m for m in model.modules() if isinstance(m, qc.AttentionKernel)]


def seeded(make):
    torch.manual_seed(0)
    return make()


def test_a_model_needs_no_wiring_and_its_chain_restarts_at_every_forward():
    model, linked = seeded(Blocks).eval(), seeded(Blocks).eval()
    qc.link_elliptical(linked)  # the explicit way gives the same numbers
    x = rand(2, 5, 16, seed=3)
    first = model(x)
    assert all(k.metric_chain is model._quest_metric_chain for k in kernels(model))  # one chain, on the model
    torch.testing.assert_close(model(x), first)  # the second forward starts the chain again
    torch.testing.assert_close(linked(x), first)
    metrics = [k._metric for k in kernels(model)]
    assert torch.equal(metrics[0], torch.ones(2, 2, 1, 8))
    assert all(not torch.allclose(m, torch.ones_like(m)) for m in metrics[1:])


def test_layer_order_is_call_order():
    model = seeded(lambda: Blocks(order=[2, 0, 1])).eval()
    model(rand(2, 5, 16, seed=4))
    first, second, third = (kernels(model)[i] for i in (2, 0, 1))
    assert torch.equal(first._metric, torch.ones_like(first._metric))  # called first: M = I
    chain = qc.MetricChain()
    values = []

    def grab(module, args, kwargs, out):
        values.append(args[2])  # the kernel's v

    hooks = [k.register_forward_hook(grab, with_kwargs=True) for k in (first, second, third)]
    model(rand(2, 5, 16, seed=4))
    for h in hooks:
        h.remove()
    expected = [chain.next_metric(v, 8) for v in values]
    for kernel, metric in zip((first, second, third), expected):
        torch.testing.assert_close(kernel._metric, metric)


def test_a_lazily_linked_model_pickles_and_deep_copies():
    import copy
    import pickle

    model = seeded(lambda: Blocks("elliptical-quest")).eval()
    x = rand(2, 5, 16, seed=5)
    expected = model(x)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model), copy.deepcopy(seeded(
            lambda: Blocks("elliptical-quest")).eval())):
        torch.testing.assert_close(clone(x), expected)
        assert {id(k.metric_chain) for k in kernels(clone)} == {id(clone._quest_metric_chain)}
        assert clone._quest_metric_chain is not model._quest_metric_chain


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("variant", ["elliptical", "elliptical-quest"])
def test_activation_checkpointing_recomputes_with_the_original_metric(variant, reentrant, causal):
    """The recomputed forward of each block replays its metric: the gradients equal those without checkpointing
    (causal calls: the estimate of the previous training call, which the recomputation must not replace)."""
    plain = seeded(lambda: Blocks(variant, causal=causal)).train()
    ckpt = seeded(lambda: Blocks(variant, checkpointed=True, reentrant=reentrant, causal=causal)).train()
    x = rand(2, 5, 16, seed=6).requires_grad_()
    grads = []
    for model in (plain, ckpt):
        if causal:  # a first training call leaves each layer an estimate for the next
            model(rand(2, 5, 16, seed=10))
        model.zero_grad()
        out = model(x)
        (out * rand(*out.shape, seed=7)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert any(not torch.allclose(k._metric, torch.ones_like(k._metric)) for k in kernels(model))
    for g_plain, g_ckpt in zip(*grads):
        torch.testing.assert_close(g_ckpt, g_plain)
    if causal:  # the estimate left for the next call is the original forward's, not the recomputation's
        for k_plain, k_ckpt in zip(kernels(plain), kernels(ckpt)):
            torch.testing.assert_close(k_ckpt._causal_metric, k_plain._causal_metric)


def test_a_kernel_called_twice_per_forward_is_not_recomputed_silently():
    model = seeded(lambda: Blocks(order=[0, 1, 0], checkpointed=True)).train()
    out = model(rand(2, 5, 16, seed=8))
    with pytest.raises(RuntimeError, match="called 2 times in the model's latest forward"):
        out.sum().backward()


class WithLogits(Blocks):
    def logits(self, x_bld):
        """A pass through another method than forward (as an LM's ``logits``)."""
        for block in self.blocks:
            x_bld = block(x_bld)
        return x_bld.sum(-1)


def test_a_pass_through_another_method_chains_the_whole_model_and_restarts():
    model = seeded(WithLogits).eval()
    x = rand(2, 5, 16, seed=9)
    first = model.logits(x)  # the first call of all: the model is found from its running method
    assert {id(k.metric_chain) for k in kernels(model)} == {id(model._quest_metric_chain)}
    torch.testing.assert_close(model.logits(x), first)  # a new pass: restarted
    torch.testing.assert_close(model(x).sum(-1), first)  # forward gives the same
    torch.testing.assert_close(model.logits(x), first)  # and a pass after a forward too
    metrics = [k._metric for k in kernels(model)]
    assert all(not torch.allclose(m, torch.ones_like(m)) for m in metrics[1:])
