"""Helpers shared by quest-core's tests (on sys.path via pytest's `pythonpath`)."""

import torch

import quest_core as qc


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def standalone_kernel(*args, **kwargs) -> qc.AttentionKernel:
    """An AttentionKernel used on its own: elliptical variants get their own metric chain (M = I: one layer)."""
    kernel = qc.AttentionKernel(*args, **kwargs)
    qc.link_elliptical(kernel)
    return kernel
