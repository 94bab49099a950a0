"""Helpers for the end-to-end tests (on sys.path via pytest's `pythonpath`): a tiny suite file, a CLI runner."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def write_suite(folder: Path, name: str, variants=("softmax", "quest"), seeds=(0, 1), steps=40, extra="") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntasks: [spurious]\nvariants: [{', '.join(variants)}]\npresets: [tiny]\n"
        f"seeds: [{', '.join(map(str, seeds))}]\noverrides: {{steps: {steps}, warmup_steps: {steps // 10}, eval_samples: 300, log_every: 10}}\n{extra}"
    )
    return path


def cli_env(**extra) -> dict:
    """The environment of a fresh shell: no Ray settings (a local sweep sets its own token), no injected faults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "QUEST_BENCH_FAULTS"}
    env.update({"TQDM_DISABLE": "1", "PATH": f"{BIN}:{env.get('PATH', '')}"}, **extra)
    return env


def quest_bench(*args, env=None, timeout=1200, cwd=REPO) -> subprocess.CompletedProcess:
    """Run the CLI; ``timeout`` bounds a hung command only (a loaded machine starts Ray in minutes)."""
    return subprocess.run([str(BIN / "quest-bench"), *map(str, args)], capture_output=True, text=True,
                          env=env or cli_env(), timeout=timeout, cwd=cwd)
