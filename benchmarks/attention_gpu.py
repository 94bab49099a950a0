"""Forward+backward time and peak memory of QUEST attention on a GPU: the fused Triton kernel (quest_core.fused)
against F.scaled_dot_product_attention, quest-core's eager path and the eager path under torch.compile.

    .venv/bin/python benchmarks/attention_gpu.py [--dtype bfloat16] [--rounds 3] [--out FILE.md]

Rows per shape: sdpa (F.scaled_dot_product_attention, the baseline), quest eager (quest_core.attention(...,
variant="quest")), quest compiled (the same under torch.compile), quest fused (quest_core.fused.fused_attention),
qknorm eager (quest_core.AttentionKernel("qknorm", ...), its learnable gain included) and qknorm fused (the same
gain through fused_attention). Times come from triton.testing.do_bench (median, CUDA events, L2 cache flushed
between calls), measured round-robin over the rows for --rounds rounds; "time / sdpa" is the median over rounds of
the row's time divided by SDPA's in the same round. Peak: torch.cuda.max_memory_allocated during one
forward+backward, minus what was allocated before it (the inputs and the output gradient). "max |Δ| vs eager":
the largest absolute difference of a fused row's output from its eager row's, in the benchmark dtype.
Realistic shapes and small, launch-overhead-bound ones are reported in separate tables. Exits 0 with a message
when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys

import torch
import torch.nn.functional as F

# (name, B, H, L, D, causal): a ViT-B/16 layer at 224 px, a GPT-2 small layer, two long-sequence layers.
REALISTIC = [
    ("ViT-B", 64, 12, 197, 64, False),
    ("GPT-2", 8, 12, 1024, 64, True),
    ("L=4096", 2, 16, 4096, 64, False),
    ("L=16384", 1, 16, 16384, 64, False),
]
SMALL = [
    ("tiny", 1, 4, 64, 64, False),
    ("small", 8, 8, 128, 64, False),
    ("small causal", 4, 12, 256, 64, True),
]
ROWS = ["sdpa", "quest eager", "quest compiled", "quest fused", "qknorm eager", "qknorm fused"]
FUSED_OF = {"quest fused": "quest eager", "qknorm fused": "qknorm eager"}
DEVICE = "cuda"


def make_rows(b: int, h: int, l: int, d: int, causal: bool, dtype: torch.dtype):
    """Inputs, an output gradient and one forward function per row (each returns the output)."""
    import quest_core as qc
    from quest_core.fused import fused_arguments, fused_attention, fused_supported

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(b, h, l, d, device=DEVICE, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    grad_out = torch.randn(b, h, l, d, device=DEVICE, dtype=dtype, generator=gen)
    qknorm = qc.AttentionKernel("qknorm", h, d, device=DEVICE, dtype=dtype)

    def quest_eager(q, k, v):
        return qc.attention(q, k, v, is_causal=causal, variant="quest")

    quest_compiled = torch.compile(quest_eager, dynamic=False)
    rows = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "quest eager": lambda: quest_eager(q, k, v),
        "quest compiled": lambda: quest_compiled(q, k, v),
        "quest fused": lambda: fused_attention(q, k, v, is_causal=causal),
        "qknorm eager": lambda: qknorm(q, k, v, is_causal=causal),
        "qknorm fused": lambda: fused_attention(q, k, v, is_causal=causal,
                                                **fused_arguments("qknorm", d, qknorm.params())),
    }
    ok, reason = fused_supported(q, k, v, is_causal=causal)
    skipped = {} if ok else {"quest fused": reason, "qknorm fused": reason}
    return (q, k, v, *qknorm.parameters()), grad_out, rows, skipped


def step_of(forward, grad_out):
    def step():
        forward().backward(grad_out)

    return step


def peak_mib(step, leaves) -> float:
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    for t in leaves:
        t.grad = None
    return peak / 2**20


def measure(shape, dtype: torch.dtype, rounds: int) -> list[dict]:
    from triton.testing import do_bench

    name, b, h, l, d, causal = shape
    leaves, grad_out, forwards, skipped = make_rows(b, h, l, d, causal, dtype)
    steps = {row: step_of(forwards[row], grad_out) for row in ROWS if row not in skipped}
    outputs = {}
    for row in list(steps):  # warm up (compiles torch.compile's graph and the Triton kernels)
        try:
            steps[row]()
            with torch.no_grad():
                outputs[row] = forwards[row]().float()
        except Exception as error:  # one broken row is reported, the others still measured
            skipped[row] = f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            del steps[row]
    if "sdpa" not in steps:
        raise RuntimeError(f"the SDPA baseline failed at {name}: {skipped['sdpa']}")
    peaks = {row: peak_mib(step, leaves) for row, step in steps.items()}
    times = {row: [] for row in steps}
    for _ in range(rounds):
        for row, step in steps.items():
            times[row].append(do_bench(step, grad_to_none=list(leaves), return_mode="median"))
    results = []
    for row in ROWS:
        entry = {"shape": f"{name} ({b},{h},{l},{d}{', causal' if causal else ''})", "row": row}
        if row in skipped:
            entry["note"] = skipped[row] if skipped[row].startswith("failed") else f"not run: {skipped[row]}"
        else:
            entry["ms"] = statistics.median(times[row])
            entry["time_ratio"] = statistics.median(t / s for t, s in zip(times[row], times["sdpa"]))
            entry["peak"] = peaks[row]
            entry["peak_ratio"] = peaks[row] / peaks["sdpa"] if peaks["sdpa"] else float("nan")
            if row in FUSED_OF and FUSED_OF[row] in outputs:
                entry["diff"] = (outputs[row] - outputs[FUSED_OF[row]]).abs().max().item()
        results.append(entry)
    del leaves, forwards, steps, outputs
    torch.cuda.empty_cache()
    return results


def table(results: list[dict]) -> list[str]:
    lines = ["| shape (B,H,L,D) | row | fwd+bwd (ms) | time / sdpa | peak (MiB) | peak / sdpa | max \\|Δ\\| vs eager |",
             "|---|---|---|---|---|---|---|"]
    for e in results:
        if "note" in e:
            note = e["note"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {e['shape']} | {e['row']} | {note} | | | | |")
            continue
        diff = f"{e['diff']:.2e}" if "diff" in e else ""
        lines.append(f"| {e['shape']} | {e['row']} | {e['ms']:.3f} | {e['time_ratio']:.3f} | {e['peak']:.1f} | "
                     f"{e['peak_ratio']:.3f} | {diff} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds of do_bench per row (median)")
    parser.add_argument("--small-only", action="store_true", help="only the small, overhead-bound shapes")
    parser.add_argument("--out", help="write the Markdown report here (it is printed either way)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: attention_gpu.py measures GPU kernels; nothing was run")
        return 0
    import triton

    # one compiled graph per shape: allow more than dynamo's default number of recompilations
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    dtype = getattr(torch, args.dtype)
    lines = [
        f"QUEST attention on {torch.cuda.get_device_name()} ({args.dtype}), torch {torch.__version__}, triton "
        f"{triton.__version__}, Python {platform.python_version()}: forward+backward, median of do_bench over "
        f"{args.rounds} round(s); ratios against F.scaled_dot_product_attention in the same run.",
        "",
    ]
    sections = [("Small, overhead-bound shapes", SMALL)]
    if not args.small_only:
        sections.insert(0, ("Realistic shapes", REALISTIC))
    for title, shapes in sections:
        results = []
        for shape in shapes:
            print(f"measuring {shape[0]} ...", file=sys.stderr, flush=True)
            results += measure(shape, dtype, args.rounds)
        lines += [f"### {title}", "", *table(results), ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
