"""Memory accounting for attention layers: bytes kept for backward and the allocator's peak during a step.

Both are structural counts, not timings, so tests can assert on them on any machine:

- ``saved_bytes(fn)``: the distinct storages autograd keeps for backward while ``fn`` runs (through
  ``torch.autograd.graph.saved_tensors_hooks``; a storage saved twice counts once, a view counts its whole storage).
- ``peak_bytes(fn)``: the highest total of live allocations while ``fn`` runs, above what was live before it.
  On CUDA, ``torch.cuda.max_memory_allocated``; on CPU, torch's profiler memory timeline (every allocation and
  free of a tensor storage, in order). The CPU path uses ``torch.profiler``'s memory profile, a private API of
  torch 2.11 (``_memory_profile``): it is what ``export_memory_timeline`` is built on, and nothing public gives
  the same count.
"""

from __future__ import annotations

from typing import Callable

import torch


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct tensor storages autograd saves for backward while ``fn`` runs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def peak_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """The allocator's peak while ``fn`` runs, in bytes above what was allocated when it started."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    live = peak = 0
    for _, action, _, size in sorted(prof._memory_profile().timeline, key=lambda event: event[0]):
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak
