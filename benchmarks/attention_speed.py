"""Forward+backward time, memory saved for backward and peak memory of every quest_core variant against
F.scaled_dot_product_attention, in float32 and bfloat16.

    .venv/bin/python benchmarks/attention_speed.py [--device cpu|cuda] [--dtypes float32 bfloat16]
                                                   [--shapes 8,4,256,64 ...] [--out FILE.md]

Times are medians over rounds (at least --repeats, and enough for --min-seconds per variant), measured round-robin
across variants in one process; each ratio to plain SDPA is the median over rounds of the variant's time divided by
SDPA's in the same round, so that drift of a shared machine cancels (the `softmax` row, which is SDPA itself behind
quest-core's wrapper, shows what noise remains). Saved for backward: the bytes of the distinct tensor
storages autograd keeps for the backward pass of one attention call (one layer), counted through
torch.autograd.graph.saved_tensors_hooks (a tensor saved twice, e.g. by the normalisation and by SDPA, counts once;
the inputs q, k, v count when saved, as SDPA saves them). Peak memory: on CUDA, max_memory_allocated; on CPU, the
peak RSS (VmHWM, reset through /proc/self/clear_refs) of a fresh subprocess per (shape, variant) during one
forward+backward, minus its RSS once the inputs exist.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import quest_core as qc

DEFAULT_SHAPES = ["8,4,256,64", "2,8,1024,64", "1,4,4096,64"]
BASELINE = "sdpa"


def make_step(name: str, b: int, h: int, l: int, d: int, device: str, dtype: torch.dtype):
    """A closure that runs forward+backward of one variant on fresh-grad inputs."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, l, d, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    kernel = None if name == BASELINE else standalone_kernel(name, h, d, device, dtype)

    def step():
        for t in (q, k, v):
            t.grad = None
        out = F.scaled_dot_product_attention(q, k, v) if kernel is None else kernel(q, k, v)
        out.sum().backward()

    return step


def standalone_kernel(name: str, h: int, d: int, device: str, dtype: torch.dtype) -> qc.AttentionKernel:
    """One attention layer; the elliptical variants get a chain that is never restarted, so every call after the
    first estimates its metric from the previous call's values, as a layer after another one does."""
    kernel = qc.AttentionKernel(name, h, d, device=device, dtype=dtype)
    kernel.metric_chain = qc.MetricChain()
    return kernel


def saved_bytes(name: str, b: int, h: int, l: int, d: int, device: str, dtype: torch.dtype) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward of the variant."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, l, d, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    kernel = None if name == BASELINE else standalone_kernel(name, h, d, device, dtype)
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.scaled_dot_product_attention(q, k, v) if kernel is None else kernel(q, k, v)
    return sum(storages.values())


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_all(names, shape, device, dtype, repeats, min_seconds):
    """Per variant: the median step time, and the median over rounds of its time divided by the baseline's time in
    the same round (paired, so that the machine's drift between rounds cancels). At least ``repeats`` rounds, more
    until each variant got ``min_seconds``."""
    steps = {n: make_step(n, *shape, device, dtype) for n in names}
    for step in steps.values():  # warm-up
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        first = time.perf_counter() - start
    repeats = max(repeats, math.ceil(min_seconds / max(first, 1e-6)))
    times = {n: [] for n in names}
    for _ in range(repeats):
        for name, step in steps.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - start)
    medians = {n: statistics.median(ts) for n, ts in times.items()}
    ratios = {n: statistics.median(t / b for t, b in zip(ts, times[BASELINE])) for n, ts in times.items()}
    return medians, ratios


def peak_memory_bytes(name, shape, device, dtype) -> int:
    if device == "cuda":
        step = make_step(name, *shape, device, dtype)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    code = (
        "import torch, sys; sys.path.insert(0, 'benchmarks'); from attention_speed import make_step, rss_kib;"
        f"s = make_step({name!r}, {', '.join(map(str, shape))}, 'cpu', torch.{str(dtype).split('.')[-1]}); "
        "base = rss_kib('VmRSS'); open('/proc/self/clear_refs', 'w').write('5'); s(); "
        "print(rss_kib('VmHWM') - base)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) * 1024


def rss_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset via /proc/self/clear_refs) in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="float32, bfloat16, float16")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="B,H,L,D")
    parser.add_argument("--repeats", type=int, default=10, help="minimum rounds (round-robin over variants)")
    parser.add_argument("--min-seconds", type=float, default=4.0, help="minimum measured time per variant and shape")
    parser.add_argument("--out", help="also write the Markdown table here")
    args = parser.parse_args(argv)
    names = [BASELINE, *qc.list_variants()]
    machine = (
        torch.cuda.get_device_name() if args.device == "cuda"
        else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
    )
    lines = [
        f"Forward+backward on {args.device} ({machine}), torch {torch.__version__}, ≥ {args.repeats} rounds and "
        f"≥ {args.min_seconds:g} s per variant; time / SDPA = median over rounds of the paired ratio; saved = bytes "
        "kept for backward per attention call.",
        "",
        "| dtype | B,H,L,D | variant | time (ms) | time / SDPA | saved (MiB) | saved / SDPA | peak mem (MiB) | "
        "peak / SDPA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for shape_text in args.shapes:
            shape = tuple(int(x) for x in shape_text.split(","))
            times, ratios = time_all(names, shape, args.device, dtype, args.repeats, args.min_seconds)
            saved = {n: saved_bytes(n, *shape, args.device, dtype) for n in names}
            mems = {n: peak_memory_bytes(n, shape, args.device, dtype) for n in names}
            for n in names:
                lines.append(
                    f"| {dtype_name} | {shape_text} | {n} | {times[n] * 1e3:.2f} | {ratios[n]:.3f} | "
                    f"{saved[n] / 2**20:.2f} | {saved[n] / saved[BASELINE]:.3f} | "
                    f"{mems[n] / 2**20:.1f} | {mems[n] / max(1, mems[BASELINE]):.3f} |"
                )
            print("\n".join(lines[-len(names):]), flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
