"""The ``quest-bench`` command line: tasks, run, sweep, leaderboard."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

from quest_bench.result import RunResult
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
    check_device(args.device)
    out = Path(args.out) if args.out else Path("results") / "adhoc" / f"{spec.task}-{spec.variant}-{spec.run_id}"
    state = prepare_run_folder(out, spec, args.force)
    if state == "finished":
        print(f"{out} already holds this finished run; nothing to do (--force runs it again)", file=sys.stderr)
        print_result(RunResult.from_dict(json.loads((out / "result.json").read_text())), out)
        return 0
    print(f"{'resuming' if state == 'resume' else 'running'} {spec.label()} -> {out}", file=sys.stderr)
    (out / "spec.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True))
    result = execute(spec, out, device=args.device, data_root=args.data_root, progress=not args.quiet)
    tmp = out / "result.json.tmp"
    tmp.write_text(result.to_json())
    tmp.replace(out / "result.json")
    print_result(result, out)
    return 0 if result.status != "failed" else 1


def check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False); "
                             "use --device cpu")


def prepare_run_folder(out: Path, spec: RunSpec, force: bool) -> str:
    """Make ``out`` ready for ``spec`` and say what it holds: "new" (a new or empty folder), "resume" (this same
    spec, unfinished: run it again), "finished" (this same spec, finished: nothing to do). With ``force``, an earlier
    run folder (one with a spec.json) is emptied first. Anything else is refused before a file is written."""
    from quest_bench.store import is_finished

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    if not out.is_dir() or not any(out.iterdir()):
        out.mkdir(parents=True, exist_ok=True)
        return "new"
    try:
        run_id = json.loads((out / "spec.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"--out {out} is not empty and holds no run (no readable spec.json); choose a new or empty "
                         "folder") from None
    if run_id == spec.run_id and not force:
        try:
            return "finished" if is_finished(RunResult.from_dict(json.loads((out / "result.json").read_text()))) \
                else "resume"
        except (OSError, ValueError, TypeError):
            return "resume"  # no readable result.json: the run was interrupted
    if not force:
        raise ValueError(f"--out {out} holds a different run ({out / 'spec.json'}); choose another folder, or pass "
                         "--force to replace it")
    for entry in out.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    return "new"


def print_result(result, out: Path) -> None:
    print(f"status: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    for name, value in sorted(result.metrics.items()):
        marker = "*" if name == result.primary_metric else " "
        print(f" {marker} {name:32s} {value:.4f}")
    print(f"   wall {result.cost.get('wall_s', float('nan')):.1f}s   result: {out / 'result.json'}")


def check_results_folder(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ValueError(f"--results {path} is a file; give a folder")


def cmd_sweep(args) -> int:
    from quest_bench.suite import load_suite
    from quest_bench.sweep import check_sweep_args, run_sweep

    check_sweep_args(args.max_retries, args.run_timeout)
    check_results_folder(Path(args.results))
    suite = load_suite(args.suite)
    counts = run_sweep(suite, Path(args.results), address=args.address, data_root=args.data_root,
                       max_retries=args.max_retries, run_timeout=args.run_timeout, wait=args.wait,
                       wait_for_resources=args.wait_for_resources, progress=not args.quiet)
    print(f"suite {suite.name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0 if counts["failed"] == 0 else 1


def cmd_leaderboard(args) -> int:
    from quest_bench.leaderboard import write_leaderboard
    from quest_bench.store import Store
    from quest_bench.suite import load_suite, suite_name

    check_results_folder(Path(args.results))
    name = suite_name(args.suite)
    store = Store(Path(args.results) / name)
    if not store.runs_dir.is_dir():
        raise ValueError(f"no results for suite {name!r} under {args.results}; run `quest-bench sweep --suite {name}` first")
    try:  # only the runs of the suite as defined now (same specs, same code versions)
        run_ids = {spec.run_id for spec in load_suite(args.suite).specs}
    except ValueError:  # no suite file (e.g. results copied from a cluster): every run in the folder
        run_ids = None
    out = Path(args.out) if args.out else store.root / "leaderboard"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    out = write_leaderboard(store, name, run_ids, out)
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
    run.add_argument("--out", help="run folder (default: results/adhoc/<task>-<variant>-<run_id>); must be new, "
                     "empty, or hold the same spec (a finished run is not repeated, an unfinished one runs again)")
    run.add_argument("--force", action="store_true", help="replace an earlier run in --out (a folder with a "
                     "spec.json), or run a finished one again")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(fn=cmd_run)

    sweep = sub.add_parser("sweep", help="run a suite (tasks × variants × seeds × presets × grid) on Ray")
    sweep.add_argument("--suite", required=True, help="suite name (configs/suites/NAME.yaml) or path")
    sweep.add_argument("--address", help="Ray cluster to join: GCS host:port or 'auto' (default: RAY_ADDRESS, "
                       "else a local Ray instance sized to this machine)")
    sweep.add_argument("--results", default="results", help="results folder (default: ./results)")
    sweep.add_argument("--data-root", help="folder with real datasets, as seen from the workers")
    sweep.add_argument("--max-retries", type=int, default=2,
                       help="retries of a run whose worker died or was killed for memory (default 2)")
    sweep.add_argument("--run-timeout", type=float, metavar="SECONDS",
                       help="cancel a run after this long and record it failed: timeout (default per preset: "
                       "tiny 1 h, small 12 h, paper 7 days)")
    sweep.add_argument("--wait", action="store_true",
                       help="if another sweep driver is using the results folder, wait for it instead of refusing")
    sweep.add_argument("--wait-for-resources", action="store_true",
                       help="submit runs that no node can host yet (autoscaling clusters) instead of refusing them")
    sweep.add_argument("--quiet", action="store_true")
    sweep.set_defaults(fn=cmd_sweep)

    board = sub.add_parser("leaderboard", help="aggregate a suite's results into Markdown + HTML")
    board.add_argument("--suite", required=True)
    board.add_argument("--results", default="results")
    board.add_argument("--out", help="output folder (default: <results>/<suite>/leaderboard)")
    board.set_defaults(fn=cmd_leaderboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every user error ends in one line on stderr and exit status 2; Ctrl-C in one line and 130 (the shell's)."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as err:
        return fail(str(err))
    except OSError as err:  # disk full, permission denied, a path that is not a folder, ...
        where = f": {err.filename}" if err.filename else ""
        return fail(f"{err.strerror or err}{where}")
    except KeyboardInterrupt:
        print("quest-bench: interrupted; finished runs are saved, run the same command again to resume",
              file=sys.stderr)
        return 130


def fail(message: str) -> int:
    print(f"quest-bench: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
