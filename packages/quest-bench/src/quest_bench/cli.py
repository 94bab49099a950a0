"""The ``quest-bench`` command line: tasks, run, sweep, leaderboard."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from quest_bench.spec import PRESETS, RunSpec

EPILOG = """examples:
  quest-bench tasks
  quest-bench run spurious --attention quest --preset tiny
  quest-bench sweep --suite smoke
  quest-bench leaderboard --suite smoke
"""


def parse_sets(pairs: list[str]) -> dict:
    """--set key=value pairs; values are parsed as YAML scalars (1e-3, true, 12) and typed by the task config."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def cmd_tasks(args) -> int:
    import quest_core

    from quest_bench.registry import get_task, task_names

    for name in task_names():
        task = get_task(name)
        direction = "higher" if task.higher_is_better else "lower"
        resources = ", ".join(f"{p}: {r.num_cpus:g} CPU/{r.num_gpus:g} GPU" for p, r in
                              ((p, task.resources_for(p)) for p in task.presets))
        print(f"{name}  (v{task.version})  primary: {task.primary_metric} ({direction} is better)")
        print(f"    presets: {', '.join(task.presets)}   [{resources}]")
    print(f"variants: {', '.join(quest_core.list_variants())}")
    return 0


def cmd_run(args) -> int:
    from quest_bench.runner import execute, resolve

    spec = resolve(RunSpec(args.task, args.attention, args.preset, args.seed, parse_sets(args.set)))
    out = Path(args.out) if args.out else Path("results") / "adhoc" / f"{spec.task}-{spec.variant}-{spec.run_id}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"running {spec.label()} -> {out}", file=sys.stderr)
    (out / "spec.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True))
    result = execute(spec, out, device=args.device, data_root=args.data_root, progress=not args.quiet)
    (out / "result.json").write_text(result.to_json())
    print(f"status: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    for name, value in sorted(result.metrics.items()):
        marker = "*" if name == result.primary_metric else " "
        print(f" {marker} {name:32s} {value:.4f}")
    print(f"   wall {result.cost['wall_s']:.1f}s   result: {out / 'result.json'}")
    return 0 if result.status != "failed" else 1


def cmd_sweep(args) -> int:
    from quest_bench.suite import load_suite
    from quest_bench.sweep import run_sweep

    suite = load_suite(args.suite)
    counts = run_sweep(suite, Path(args.results), address=args.address, data_root=args.data_root,
                       max_retries=args.max_retries, progress=not args.quiet)
    print(f"suite {suite.name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0 if counts["failed"] == 0 else 1


def cmd_leaderboard(args) -> int:
    from quest_bench.leaderboard import write_leaderboard
    from quest_bench.store import Store
    from quest_bench.suite import load_suite, suite_name

    name = suite_name(args.suite)
    store = Store(Path(args.results) / name)
    if not store.runs_dir.exists():
        raise ValueError(f"no results for suite {name!r} under {args.results}; run `quest-bench sweep --suite {name}` first")
    try:  # only the runs of the suite as defined now (same specs, same code versions)
        run_ids = {spec.run_id for spec in load_suite(args.suite).specs}
    except ValueError:  # no suite file (e.g. results copied from a cluster): every run in the folder
        run_ids = None
    out = write_leaderboard(store, name, run_ids)
    print((out / "README.md").read_text())
    print(f"leaderboard: {out / 'README.md'}\n             {out / 'index.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quest-bench", description="QUEST attention benchmark runner.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tasks", help="list tasks, presets, metrics and variants").set_defaults(fn=cmd_tasks)

    run = sub.add_parser("run", help="run one task in this process (no Ray)")
    run.add_argument("task")
    run.add_argument("--attention", default="quest", help="attention variant (see `quest-bench tasks`)")
    run.add_argument("--preset", default="tiny", choices=PRESETS)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a task config key")
    run.add_argument("--data-root", help="folder with real datasets (defaults use shipped or generated data)")
    run.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    run.add_argument("--out", help="run folder (default: results/adhoc/<task>-<variant>-<run_id>)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(fn=cmd_run)

    sweep = sub.add_parser("sweep", help="run a suite (tasks × variants × seeds × presets × grid) on Ray")
    sweep.add_argument("--suite", required=True, help="suite name (configs/suites/NAME.yaml) or path")
    sweep.add_argument("--address", help="Ray cluster to join: GCS host:port or 'auto' (default: RAY_ADDRESS, "
                       "else a local Ray instance sized to this machine)")
    sweep.add_argument("--results", default="results", help="results folder (default: ./results)")
    sweep.add_argument("--data-root", help="folder with real datasets, as seen from the workers")
    sweep.add_argument("--max-retries", type=int, default=2, help="retries of a run whose worker died")
    sweep.add_argument("--quiet", action="store_true")
    sweep.set_defaults(fn=cmd_sweep)

    board = sub.add_parser("leaderboard", help="aggregate a suite's results into Markdown + HTML")
    board.add_argument("--suite", required=True)
    board.add_argument("--results", default="results")
    board.set_defaults(fn=cmd_leaderboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as err:
        print(f"quest-bench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
