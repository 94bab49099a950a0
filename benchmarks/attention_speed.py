"""Forward+backward time, memory saved for backward and allocator peak of quest_core's variants against
F.scaled_dot_product_attention, as paired ratios, in three tables:

1. realistic shapes (ViT-B at 197 tokens, GPT-2 at 1024 causal, 4096 tokens; on a CPU with a smaller batch),
2. overhead-bound shapes (tiny ones, where per-call Python and kernel launches dominate),
3. a timm ViT-S block stack (fused qkv, the layout users train): saved bytes and allocator peak per variant.

    .venv/bin/python benchmarks/attention_speed.py [--device cpu|cuda] [--dtypes float32 bfloat16]
                                                   [--compiled quest qknorm] [--quick] [--out FILE.md]

Rows: ``sdpa`` (the baseline), every variant eager, ``<variant> (compiled)`` (torch.compile, inductor) and, on a
GPU where the Triton kernel applies, ``<variant> (fused)`` (``quest_core.fused``). Times are medians over rounds
measured round-robin in one process; each ratio is the median over rounds of the row's time divided by SDPA's in
the same round, so that a shared machine's drift cancels (the ``softmax`` row is SDPA behind quest-core's wrapper:
it shows the remaining noise). Saved: ``quest_core.saved_bytes``; peak: ``quest_core.peak_bytes`` (CUDA's
max_memory_allocated, or torch's profiler memory timeline on a CPU), both above the inputs.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import quest_core as qc

BASELINE = "sdpa"


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    l: int
    d: int
    causal: bool = False
    label: str = ""

    def __str__(self) -> str:
        return f"{self.label} {self.b},{self.h},{self.l},{self.d}{' causal' if self.causal else ''}".strip()


REALISTIC = {
    "cuda": [Shape(64, 12, 197, 64, label="ViT-B"), Shape(8, 12, 1024, 64, True, "GPT-2"),
             Shape(2, 16, 4096, 64, True, "4k"), Shape(1, 16, 16384, 64, True, "16k")],
    "cpu": [Shape(8, 12, 197, 64, label="ViT-B"), Shape(1, 12, 1024, 64, True, "GPT-2"),
            Shape(1, 4, 4096, 64, True, "4k")],
}
OVERHEAD_BOUND = [Shape(1, 2, 64, 32, label="tiny"), Shape(4, 4, 128, 64, label="small")]


def row_names(variants: list[str], compiled: list[str], fused: list[str]) -> list[str]:
    return [BASELINE, *variants, *(f"{v} (compiled)" for v in compiled), *(f"{v} (fused)" for v in fused)]


def make_call(row: str, s: Shape, device: str, dtype: torch.dtype):
    """The attention call of one row on (B, H, L, D) inputs: a function of (q, k, v)."""
    if row == BASELINE:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=s.causal)
    variant, _, mode = row.partition(" (")
    kernel = qc.AttentionKernel(variant, s.h, s.d, device=device, dtype=dtype)
    kernel.metric_chain = qc.MetricChain()  # elliptical: later calls estimate from the previous call's values
    if mode == "fused)":
        from quest_core.fused import fused_arguments, fused_attention

        return lambda q, k, v: fused_attention(q, k, v, is_causal=s.causal,
                                               **fused_arguments(variant, s.d, kernel.params()))
    call = lambda q, k, v: kernel(q, k, v, is_causal=s.causal)  # noqa: E731
    return torch.compile(call) if mode == "compiled)" else call


def make_step(row: str, s: Shape, device: str, dtype: torch.dtype):
    """A closure that runs forward+backward of one row on fresh-grad inputs."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(s.b, s.h, s.l, s.d, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    call = make_call(row, s, device, dtype)

    def step():
        for t in (q, k, v):
            t.grad = None
        call(q, k, v).sum().backward()

    return step, (q, k, v), call


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_rows(rows, s: Shape, device, dtype, repeats, min_seconds):
    """Per row: the median step time, and the median over rounds of its time divided by the baseline's time in
    the same round. At least ``repeats`` rounds, more until each row got ``min_seconds``."""
    steps = {r: make_step(r, s, device, dtype)[0] for r in rows}
    slowest = 0.0
    for step in steps.values():  # warm-up (and compilation)
        step()
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        slowest = max(slowest, time.perf_counter() - start)
    rounds = max(repeats, math.ceil(min_seconds / max(slowest, 1e-6)))
    times = {r: [] for r in rows}
    for _ in range(rounds):
        for row, step in steps.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            times[row].append(time.perf_counter() - start)
    medians = {r: statistics.median(ts) for r, ts in times.items()}
    ratios = {r: statistics.median(t / b for t, b in zip(ts, times[BASELINE])) for r, ts in times.items()}
    return medians, ratios, rounds


def memory_of(row: str, s: Shape, device, dtype) -> tuple[int, int]:
    """(bytes saved for backward by one call, allocator peak of one forward+backward) of a row."""
    step, (q, k, v), call = make_step(row, s, device, dtype)
    step()  # compile / estimate once outside the count
    saved = qc.saved_bytes(lambda: call(q, k, v))
    return saved, qc.peak_bytes(step, device)


def shape_table(title: str, shapes, rows, device, dtypes, repeats, min_seconds) -> list[str]:
    lines = [f"### {title}", "",
             "| dtype | shape (B,H,L,D) | row | time (ms) | time / SDPA | saved / SDPA | peak / SDPA |",
             "|---|---|---|---|---|---|---|"]
    for dtype in dtypes:
        for s in shapes:
            medians, ratios, rounds = time_rows(rows, s, device, dtype, repeats, min_seconds)
            memory = {r: memory_of(r, s, device, dtype) for r in rows}
            base_saved, base_peak = memory[BASELINE]
            for r in rows:
                saved, peak = memory[r]
                lines.append(f"| {str(dtype).split('.')[-1]} | {s} | {r} | {medians[r] * 1e3:.2f} | {ratios[r]:.3f} | "
                             f"{saved / base_saved:.3f} | {peak / max(1, base_peak):.3f} |")
            print("\n".join(lines[-len(rows):]), f"\n({rounds} rounds)", flush=True)
    return lines + [""]


def vit_block_table(variants, device, dtypes, batch: int) -> list[str]:
    """Saved bytes and allocator peak of a 2-block timm ViT-S stack (fused qkv), swapped to each variant."""
    import timm

    torch.manual_seed(0)
    blocks = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2).blocks
    lines = [f"### timm ViT-S block stack (2 blocks, B={batch}, 197 tokens, fused qkv)", "",
             "| dtype | variant | saved (MiB) | saved / stock | peak (MiB) | peak / stock |", "|---|---|---|---|---|---|"]
    for dtype in dtypes:
        x = torch.randn(batch, 197, 384, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        results = {}
        for variant in ["stock", *variants]:
            model = copy.deepcopy(blocks).to(device, dtype)
            if variant != "stock":
                qc.swap_attention(model, variant)
            saved = qc.saved_bytes(lambda: model(x.clone().requires_grad_()))
            peak = qc.peak_bytes(lambda: model(x.clone().requires_grad_()).float().square().sum().backward(), device)
            results[variant] = (saved, peak)
        for variant, (saved, peak) in results.items():
            lines.append(f"| {str(dtype).split('.')[-1]} | {variant} | {saved / 2**20:.2f} | "
                         f"{saved / results['stock'][0]:.4f} | {peak / 2**20:.2f} | {peak / results['stock'][1]:.3f} |")
    return lines + [""]


def fused_rows(device: str, wanted: list[str]) -> list[str]:
    if device != "cuda":
        return []
    try:
        from quest_core.fused import fused_supported
    except ImportError:
        return []
    probe = torch.zeros(1, 1, 16, 64, device=device, dtype=torch.bfloat16)
    return [v for v in wanted if fused_supported(probe, probe, probe, variant=v)[0]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="float32, bfloat16, float16")
    parser.add_argument("--variants", nargs="+", default=qc.list_variants())
    parser.add_argument("--compiled", nargs="*", default=["quest", "qknorm"], help="variants also run compiled")
    parser.add_argument("--repeats", type=int, default=5, help="minimum rounds (round-robin over rows)")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="minimum measured time per row and shape")
    parser.add_argument("--quick", action="store_true", help="only softmax, quest and qknorm (a smoke run)")
    parser.add_argument("--tables", nargs="+", default=["realistic", "overhead", "vit"],
                        choices=["realistic", "overhead", "vit"], help="which tables to measure")
    parser.add_argument("--out", help="also write the Markdown tables here")
    args = parser.parse_args(argv)
    variants = ["softmax", "quest", "qknorm"] if args.quick else args.variants
    dtypes = [getattr(torch, name) for name in args.dtypes]
    rows = row_names(variants, args.compiled, fused_rows(args.device, ["quest", "qnorm", "qknorm", "qknorm-hs"]))
    machine = (torch.cuda.get_device_name() if args.device == "cuda"
               else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads")
    lines = [f"Forward+backward on {args.device} ({machine}), torch {torch.__version__}; ≥ {args.repeats} rounds "
             f"and ≥ {args.min_seconds:g} s per row; load average at start {os.getloadavg()[0]:.2f} "
             f"({os.cpu_count()} CPUs). Time ratios are paired against SDPA in the same run (noisy on a loaded "
             "machine); memory ratios are exact byte counts.", ""]
    if "realistic" in args.tables:
        lines += shape_table("Realistic shapes", REALISTIC[args.device], rows, args.device, dtypes, args.repeats,
                             args.min_seconds)
    if "overhead" in args.tables:
        lines += shape_table("Overhead-bound shapes", OVERHEAD_BOUND, rows, args.device, dtypes, args.repeats,
                             args.min_seconds)
    if "vit" in args.tables:
        lines += vit_block_table([v for v in variants if v != "softmax"], args.device, dtypes,
                                 64 if args.device == "cuda" else 8)
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
