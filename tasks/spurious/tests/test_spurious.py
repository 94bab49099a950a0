"""The probe's data follow the paper's construction; the model trains; the Bayes ceiling is right."""

import math

import torch

from quest_spurious.data import ProbeData
from quest_spurious.model import ProbeModel


def test_answer_tokens_follow_the_two_distributions():
    data = ProbeData(seq_len=8, key_dim=6, signal_dims=2, signal_var=4.0, bias_norm=3.0, bias_var=0.1)
    gen = torch.Generator().manual_seed(0)
    x_k, x_v, label, pos, is_biased = data.sample(20000, gen)
    rows = torch.arange(len(pos))
    answer = x_k[rows, pos]
    assert 0.47 < is_biased.float().mean() < 0.53
    assert torch.equal(x_v[rows, pos].argmax(-1), label)
    biased = answer[is_biased]
    torch.testing.assert_close(biased.mean(0), data.bias_vector(), atol=0.02, rtol=0)
    torch.testing.assert_close(biased.var(0), torch.full((6,), 0.1), atol=0.01, rtol=0)
    unbiased = answer[~is_biased]
    torch.testing.assert_close(unbiased.var(0), data.sigma_diag(), atol=0.15, rtol=0.05)
    torch.testing.assert_close(unbiased.mean(0), torch.zeros(6), atol=0.05, rtol=0)
    others = x_k.clone()
    others[rows, pos] = math.nan
    flat = others.reshape(-1, 6)
    flat = flat[~flat.isnan().any(1)]
    torch.testing.assert_close(flat.var(0), torch.ones(6), atol=0.03, rtol=0)
    assert torch.allclose(data.bias_vector().norm(), torch.tensor(3.0))


def test_bayes_accuracy_grows_with_the_signal_from_the_uniform_reader():
    accs, uniform = [], []
    for var in (1.0, 2.0, 8.0):
        data = ProbeData(signal_var=var)
        x_k, x_v, label, _, _ = data.sample(4000, torch.Generator().manual_seed(1), biased=False)
        accs.append(data.bayes_accuracy(x_k, x_v, label))
        uniform.append(data.uniform_accuracy(x_v, label))
    # no signal (Σ = I): the optimal reader is the uniform reader (most frequent value), well above 1/C = 0.125
    assert abs(accs[0] - uniform[0]) < 0.02 and 0.2 < uniform[0] < 0.35
    assert accs[0] < accs[1] < accs[2] < 1.0


def test_model_forward_shapes_and_key_norms():
    model = ProbeModel("quest", key_dim=8, num_values=8)
    x_k, x_v = torch.randn(5, 16, 8), torch.nn.functional.one_hot(torch.randint(8, (5, 16)), 8).float()
    assert model(x_k, x_v).shape == (5, 8)
    assert model.keys(x_k).shape == (5, 16, 16)
