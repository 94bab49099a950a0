"""``make gpu-check``: what a lent GPU should confirm, in one command (no datasets; docs/gpu-check.md).

    .venv/bin/python benchmarks/gpu_check.py [--steps 300] [--out docs/gpu-check.md] [--skip-tests]

1. The CUDA tests: ``pytest -m gpu`` (the fused kernels, bf16 runs of the tasks).
2. ``lm`` at its ``paper`` model size (Transformer-XL base: 16 layers of width 410, windows of 512 tokens, global
   batch 60, bf16) on the shipped text (wikitext-mini), for softmax, QUEST and QKNorm, at the paper's learning rate
   and at 40 times it, ``--steps`` steps each (warm-up: a tenth of them). Reported per run: how it ended (ok, or
   diverged at a step), the largest attention logit over training and at the end, test perplexity, tokens/s and the
   sustained training TFLOP/s those tokens/s mean for the paper model (``Throughput.flops_per_sample`` of the lm's
   paper preset) -- the number to give ``sweep --dry-run --gpu-tflops`` to calibrate GPU-hour estimates. Tokens/s
   count the whole run (model set-up and a short evaluation included), so they understate training throughput.

``--out FILE`` writes the report there: between the output markers when FILE has them (``docs/gpu-check.md``, the
guide to reading it, keeps its text around them), else as the whole file.

Without a CUDA device it prints why and exits 0 (nothing is written). ``--device cpu`` with ``--set`` overrides
(e.g. a smaller model) runs the same pipeline on a CPU, for tests. Exit status: 1 when a CUDA test failed or a run
failed (a diverged run is a result, not a failure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("softmax", "quest", "qknorm")
LR_FACTORS = (1, 40)  # the paper's learning rate, and 40 times it
EVAL_TOKENS = 20_000
BEGIN = "<!-- gpu-check output: written by benchmarks/gpu_check.py -->"
END = "<!-- end of gpu-check output -->"


def write_report(path: Path, report: str) -> None:
    """``report`` into ``path``: between ``BEGIN`` and ``END`` when the file has both (its title as a level-3
    heading, the text around the markers kept), else as the whole file."""
    text = path.read_text() if path.exists() else ""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if begin and end:
        path.write_text(f"{head}{BEGIN}\n\n###{report.removeprefix('#')}\n{END}{tail}")
    else:
        path.write_text(report)


def lm_run(variant: str, lr: float, steps: int, device: str, sets: dict[str, str], folder: Path) -> dict:
    """One lm run at the paper preset on the shipped text; what the report shows of it."""
    from quest_bench.registry import get_task
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"dataset": "wikitext-mini", "steps": steps, "warmup_steps": steps // 10, "lr": lr,
                 "eval_tokens": EVAL_TOKENS, "log_every": 10, "amp": device == "cuda", **sets}
    task = get_task("lm")
    spec = resolve(RunSpec("lm", variant, "paper", 0, overrides))
    result = execute(spec, folder, device=device, progress=False)
    rows = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()] \
        if (folder / "events.jsonl").exists() else []
    logits = [r["max_logit"] for r in rows if "max_logit" in r]
    config = task.make_config("paper", spec.overrides)
    tokens_per_s = result.cost.get("samples_per_s", 0.0) * config.context
    paper_model = not sets  # the declaration's FLOPs describe the paper model only
    flops = task.resources_for("paper").throughput.flops_per_sample / config.context if paper_model else float("nan")
    ended = result.status if result.status != "diverged" else f"diverged at step {result.diverged_step}"
    return {"variant": variant, "lr": lr, "ended": ended, "reason": result.reason or "",
            "max_logit": max(logits) if logits else float("nan"), "final_logit": logits[-1] if logits else float("nan"),
            "test_ppl": result.metrics.get("test_ppl", float("nan")), "tokens_per_s": tokens_per_s,
            "tflops": tokens_per_s * flops / 1e12, "failed": result.status == "failed"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=300, help="training steps per lm run (default 300)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an lm config key in every run (e.g. a smaller model for a CPU test)")
    parser.add_argument("--skip-tests", action="store_true", help="only the lm runs")
    parser.add_argument("--out", help="also write the report (Markdown) to this file")
    args = parser.parse_args(argv)
    if args.steps < 10:
        raise SystemExit(f"gpu_check: --steps must be >= 10, got {args.steps}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: skipped: no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    from quest_bench.cli import parse_sets
    from quest_lm.task import LmTask

    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    lines = [f"# GPU check on {where}", "",
             f"torch {torch.__version__} (CUDA {torch.version.cuda}), `benchmarks/gpu_check.py --steps {args.steps}`"
             + "".join(f" --set {s}" for s in args.set), ""]
    status = 0
    if not args.skip_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"],
                               cwd=REPO, capture_output=True, text=True)
        summary = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
        lines += [f"CUDA tests (`pytest -m gpu`): {summary}", ""]
        if tests.returncode:
            status = 1
            print(tests.stdout[-5000:], tests.stderr[-2000:], sep="\n", file=sys.stderr)
    paper_lr = LmTask.presets["paper"]["lr"]
    model = "paper model size" if not args.set else "paper preset with the overrides above"
    lines += [f"lm, {model}, wikitext-mini, {args.steps} steps; the paper's learning rate is {paper_lr:g}.",
              "", "| variant | lr | ended | max logit (training) | max logit (end) | test ppl | tokens/s | TFLOP/s |",
              "|---|---|---|---|---|---|---|---|"]
    sets = parse_sets(args.set)  # as `quest-bench run --set`
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        for variant in VARIANTS:
            for factor in LR_FACTORS:
                row = lm_run(variant, paper_lr * factor, args.steps, args.device, sets,
                             Path(scratch) / f"{variant}-{factor}")
                status = status or int(row["failed"])
                lines.append(f"| {variant} | {row['lr']:g} ({factor}x) | {row['ended']} | {row['max_logit']:.4g} | "
                             f"{row['final_logit']:.4g} | {row['test_ppl']:.4g} | {row['tokens_per_s']:.0f} | "
                             f"{row['tflops']:.3g} |")
                print(lines[-1], flush=True)
    lines += ["", "TFLOP/s: tokens/s x the paper model's training FLOPs per token (`quest_lm.task`'s throughput "
              "declaration; not shown with overrides); pass it to `quest-bench sweep --dry-run --gpu-tflops` to "
              "calibrate GPU-hour estimates."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        write_report(Path(args.out), report)
    return status


if __name__ == "__main__":
    sys.exit(main())
