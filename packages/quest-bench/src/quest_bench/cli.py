"""The ``quest-bench`` command line: tasks, config, suites, run, sweep, runs, show, compare, export, leaderboard."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from quest_bench.result import RunResult
from quest_bench.spec import RunSpec, slug

EPILOG = """examples:
  quest-bench tasks                                   # tasks, presets, metrics, resources; variants
  quest-bench config lm --preset small                # every config key: value, type, valid values, meaning
  quest-bench run spurious --attention quest --preset tiny
  quest-bench run --spec results/adhoc/<folder>/spec.json   # repeat a run exactly
  quest-bench suites                                  # suites, their size and estimated cost
  quest-bench sweep --suite smoke
  quest-bench runs --suite smoke --status failed      # list runs; `show ID`, `compare ID ID` for one or several
  quest-bench export --suite smoke --format csv
  quest-bench leaderboard --suite smoke
"""


def parse_sets(pairs: list[str]) -> dict:
    """--set key=value pairs; values are parsed as YAML scalars (1e-3, true, 12) and typed by the task config."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value  # not a YAML scalar: the raw text (a string field takes it as it is)
        if not isinstance(out[key.strip()], (str, int, float, bool)):
            out[key.strip()] = value  # a list or mapping: the raw text, checked against the field's type
    return out


def check_run_options(args) -> None:
    """The options `run` and `sweep` share, checked before a folder is created or Ray starts (exit 2): the same
    rules for both."""
    from quest_bench.result import check_seed, is_int

    def at_least(option: str, value, low: int) -> None:
        if value is not None and not (is_int(value) and value >= low):
            raise ValueError(f"{option} must be an integer >= {low}, got {value!r}")

    at_least("--workers", getattr(args, "workers", None), 1)
    at_least("--threads", getattr(args, "threads", None), 1)
    at_least("--checkpoint-every", getattr(args, "checkpoint_every", None), 0)
    at_least("--max-failures", getattr(args, "max_failures", None), 0)
    if getattr(args, "seed", None) is not None:
        check_seed(args.seed, "--seed")
    if getattr(args, "attention", None) is not None:
        from quest_bench.spec import check_name

        check_name("variant", args.attention)  # "" is refused, not taken as the default


def cmd_tasks(args) -> int:
    import quest_core

    from quest_bench.registry import get_task, task_names

    for name in task_names():
        task = get_task(name)
        direction = "higher" if task.higher_is_better else "lower"
        resources = ", ".join(f"{p}: {f'{r.workers} x ' if r.workers > 1 else ''}{r.num_cpus:g} CPU/{r.num_gpus:g} GPU"
                              for p, r in ((p, task.resources_for(p)) for p in task.presets))
        print(f"{name}  (v{task.version})  primary: {task.primary_metric} ({direction} is better)")
        print(f"    presets: {', '.join(task.presets)}   [{resources}]")
    print(f"variants: {', '.join(quest_core.list_variants())}")
    return 0


def cmd_config(args) -> int:
    from quest_bench.configdoc import describe_config
    from quest_bench.registry import get_task

    task = get_task(args.task)
    overrides = parse_sets(args.set)
    config = task.make_config(args.preset, overrides)
    rows = describe_config(config)
    if args.format == "json":
        print(json.dumps({"task": task.name, "preset": args.preset, "config": rows}, indent=2, default=str))
    elif args.format == "yaml":
        print(yaml.safe_dump({r["key"]: r["value"] for r in rows}, sort_keys=False).rstrip())
    else:
        from quest_bench.runs import table

        print(f"{task.name} (v{task.version}), preset {args.preset}" + (f", --set {overrides}" if overrides else ""))
        print(table(["key", "value", "type", "valid", "meaning"],
                    [[("*" if r["key"] in overrides or r["key"] in task.presets[args.preset] else " ") + r["key"],
                      repr(r["value"]) if isinstance(r["value"], str) else str(r["value"]), r["type"], r["valid"],
                      r["comment"]] for r in rows]))
        print("(* = set by the preset or --set; the rest are the config class's defaults)")
    return 0


def cmd_suites(args) -> int:
    from quest_bench.runs import collect, table
    from quest_bench.suite import known_suites, load_suite

    exact, similar = {}, {}  # earlier runs' wall times: by run_id, and by (task, preset, overrides)
    for r in (collect(Path(args.results)).results if Path(args.results).is_dir() else []):
        if "wall_s" in r.cost and r.status != "failed":
            exact[r.run_id] = r.cost["wall_s"]
            similar.setdefault((r.task, r.preset, json.dumps(r.overrides, sort_keys=True)), []).append(r.cost["wall_s"])
    rows = []
    for name, path in known_suites().items():
        try:
            suite = load_suite(str(path))
        except ValueError as err:
            rows.append([name, "-", "-", "-", "-", f"invalid: {err}"[:60]])
            continue
        seconds, measured, estimated = 0.0, 0, 0
        for spec in suite.specs:
            alike = similar.get((spec.task, spec.preset, json.dumps(spec.overrides, sort_keys=True)))
            if spec.run_id in exact:
                seconds, measured = seconds + exact[spec.run_id], measured + 1
            elif alike:  # same task, preset and overrides, another variant or seed
                seconds, estimated = seconds + sum(alike) / len(alike), estimated + 1
        unknown = len(suite.specs) - measured - estimated
        cost = "unknown (no earlier runs like these)" if not measured + estimated else (
            (f"~{seconds / 60:.0f} min" if seconds >= 120 else f"~{seconds:.0f} s")
            + f" ({measured} measured, {estimated} from similar runs" + (f", {unknown} unknown)" if unknown else ")"))
        rows.append([suite.name, str(len(suite.specs)), ",".join(sorted({s.task for s in suite.specs})),
                     str(len({s.variant for s in suite.specs})), str(len({s.seed for s in suite.specs})), cost])
    print(table(["suite", "runs", "tasks", "variants", "seeds", "estimated cost (sum of run times)"], rows))
    return 0


def spec_from_args(args) -> RunSpec:
    """The spec of `quest-bench run`: from TASK and options, or from --spec (a run's spec.json, with its data root and
    thread count unless given here)."""
    if args.spec and args.task:
        raise ValueError("give a TASK or --spec PATH, not both")
    if not args.spec:
        if not args.task:
            raise ValueError("give a TASK (see `quest-bench tasks`) or --spec PATH/spec.json")
        variant = "quest" if args.attention is None else args.attention
        return RunSpec(args.task, variant, args.preset or "tiny", 0 if args.seed is None else args.seed,
                       parse_sets(args.set))
    try:
        record = json.loads(Path(args.spec).read_text())
        check_spec_record(record)
        spec = RunSpec.from_json(record)
    except OSError as err:
        raise ValueError(f"cannot read --spec {args.spec}: {err.strerror}") from None
    except RecursionError:
        raise ValueError(f"--spec {args.spec} is not a run's spec.json: nested too deeply") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"--spec {args.spec} is not a run's spec.json: {err}") from None
    if args.attention or args.preset or args.seed is not None or args.set:
        raise ValueError("--spec repeats a run exactly: --attention, --preset, --seed and --set cannot be combined")
    args.data_root = args.data_root or record.get("data_root")
    args.threads = args.threads or record.get("torch_threads")
    if spec.code_version:
        from quest_bench.registry import code_version, get_task

        now = code_version(get_task(spec.task))
        if now != spec.code_version:
            print(f"note: the spec was run with {spec.code_version}, this checkout has {now}: results may differ",
                  file=sys.stderr)
    return spec


def check_spec_record(record) -> None:
    """A spec.json's fields, checked as `run`'s options are: names, seed, overrides (an object nested at most
    MAX_DEPTH levels), torch_threads, data_root."""
    from quest_bench.result import MAX_DEPTH, check_seed, depth, is_int

    if not isinstance(record, dict):
        raise ValueError("expected an object with task, variant, preset, seed (an integer) and overrides (an object)")
    for key in ("task", "variant"):
        if not isinstance(record.get(key), str):
            raise ValueError(f"{key!r} must be a name (a string), got {record.get(key)!r}")
    if not isinstance(record.get("preset", "tiny"), str):  # the task checks the name against its presets
        raise ValueError(f"'preset' must be a name (a string), got {record.get('preset')!r}")
    check_seed(record.get("seed", 0), "'seed'")
    overrides = record.get("overrides", {})
    if not isinstance(overrides, dict) or depth(overrides) > MAX_DEPTH:
        raise ValueError(f"'overrides' must be an object (nested at most {MAX_DEPTH} levels), got "
                         f"{type(overrides).__name__}")
    threads = record.get("torch_threads")
    if threads is not None and not (is_int(threads) and threads >= 1):
        raise ValueError(f"'torch_threads' must be null or an integer >= 1, got {threads!r}")
    if not isinstance(record.get("data_root") or "", str):
        raise ValueError(f"'data_root' must be null or a path (a string), got {record.get('data_root')!r}")
    if not isinstance(record.get("code_version", ""), str):
        raise ValueError(f"'code_version' must be a string, got {record.get('code_version')!r}")


def cmd_run(args) -> int:
    from quest_bench.runner import resolve
    from quest_bench.store import StoreLock

    check_run_options(args)

    from quest_bench.registry import check_data

    spec = resolve(spec_from_args(args))
    check_data([spec], args.data_root)  # before a folder is written or Ray starts
    check_device(args.device)
    from quest_bench.registry import get_task

    workers = args.workers or get_task(spec.task).resources_for(spec.preset).workers
    get_task(spec.task).check_workers(workers)  # refused before anything is written
    out = Path(args.out) if args.out else Path("results") / "adhoc" / f"{spec.task}-{spec.variant}-{spec.run_id}"
    if out.is_dir():  # another `run` (or a sweep's driver) writing there: refused before anything is touched
        from quest_bench.store import Store

        holder = Store(out).lock_holder()
        if holder:
            raise ValueError(RUN_BUSY.format(out=out, holder=holder))
    state = prepare_run_folder(out, spec, args.force)
    with StoreLock(out / ".lock", busy=RUN_BUSY.format(out=out, holder="{holder}")):
        return run_in_folder(args, spec, out, state, workers)


RUN_BUSY = "--out {out} is in use by another run ({holder}); wait for it to finish or choose another folder"


def run_in_folder(args, spec: RunSpec, out: Path, state: str, workers: int) -> int:
    """`run`'s part after its checks, holding the folder's lock."""
    from quest_bench.runner import execute
    from quest_bench.store import spec_record

    if state == "finished":
        print(f"{out} already holds this finished run; nothing to do (--force runs it again)", file=sys.stderr)
        print_result(RunResult.from_dict(json.loads((out / "result.json").read_text())), out)
        return 0
    print(f"{'resuming' if state == 'resume' else 'running'} {spec.label()} -> {out}", file=sys.stderr)
    (out / "spec.json").write_text(json.dumps(spec_record(spec), indent=2, sort_keys=True))
    if workers > 1:
        result = run_distributed(spec, out, args, workers)
    else:
        result = execute(spec, out, device=args.device, data_root=args.data_root, progress=not args.quiet,
                         checkpoint_every=args.checkpoint_every, threads=args.threads)
    (out / "spec.json").write_text(json.dumps(spec_record(spec, result), indent=2, sort_keys=True))
    tmp = out / "result.json.tmp"
    tmp.write_text(result.to_json())
    tmp.replace(out / "result.json")
    print_result(result, out)
    return 0 if result.status != "failed" else 1


def run_distributed(spec: RunSpec, out: Path, args, workers: int):
    """``run --workers N``: one run on N data-parallel workers of a local Ray instance (or RAY_ADDRESS's cluster)."""
    from quest_bench.distributed import execute_distributed
    from quest_bench.sweep import ray_session

    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    with ray_session(None, max_retries=args.max_failures) as ray:
        cpus = sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive"))
        if args.device == "cpu" and cpus < workers:
            raise ValueError(f"--workers {workers} needs {workers} CPUs; this Ray instance has {cpus:g}")
        return execute_distributed(spec, out, workers, args.device, args.data_root, progress=not args.quiet,
                                   checkpoint_every=args.checkpoint_every, max_failures=args.max_failures,
                                   threads=args.threads)


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
    if not out.is_dir() or not any(e.name != ".lock" for e in out.iterdir()):  # .lock: a run's lock file
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
        except (OSError, ValueError, TypeError, RecursionError):
            return "resume"  # no readable result.json: the run was interrupted
    if not force:
        raise ValueError(f"--out {out} holds a different run ({out / 'spec.json'}); choose another folder, or pass "
                         "--force to replace it")
    for entry in out.iterdir():
        if entry.name != ".lock":  # held by this run from now on
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


def existing_results(path: Path) -> Path:
    """--results of a command that reads results: a folder that exists."""
    check_results_folder(path)
    if not path.is_dir():
        raise ValueError(f"no results folder {path}: run a sweep or `quest-bench run` first, or pass --results FOLDER")
    return path


SHAPE_ARGS = ("variants", "seeds", "preset", "set", "grid", "tune", "name")


def add_shape_args(parser: argparse.ArgumentParser, task_help: str | None = None) -> None:
    """The options that make a suite on the command line (``suite.cli_suite``); ``task_help``: add --task too."""
    if task_help:
        parser.add_argument("--task", help=task_help)
    parser.add_argument("--variants", help="with --task: comma list of variants, or all (default softmax,quest)")
    parser.add_argument("--seeds", help="with --task: 0-4, 0,2,5 or 3 (default 0)")
    parser.add_argument("--preset", help="with --task: preset, or a comma list (default tiny)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --task: a task config key set in every run (repeatable)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="with --task: values of a config key, one run per combination (repeatable)")
    parser.add_argument("--tune", metavar="KEYS", help="with --task: grid keys each variant is tuned over (a tuned "
                        "suite: the leaderboard takes each variant's best cell on validation)")
    parser.add_argument("--name", help="with --task: the suite's name (default: <task>-cli-<hash of its runs>)")


def shaped_suite(args, required: bool = False):
    """The suite the command line makes (``--task`` with the options of ``add_shape_args``) as (suite, its
    definition), or None when none is asked for (``required``: --task alone makes one)."""
    from quest_bench.suite import cli_suite, parse_grid

    shaped = [k for k in SHAPE_ARGS if getattr(args, k, None)]
    if not shaped and not (required and getattr(args, "task", None)):
        return None
    if not args.task:
        raise ValueError(f"--{shaped[0]} shapes a suite on the command line and needs --task TASK")
    return cli_suite(args.task, args.variants or "softmax,quest", args.seeds or "0", args.preset or "tiny",
                     parse_sets(args.set), parse_grid(args.grid), args.tune, args.name)


def given_suites(args) -> list[str]:
    """--suite values (names, files, or command-line suites recorded under --results) plus the suite the
    shape options make."""
    from quest_bench.suite import RECORD, recorded_suite

    given = [recorded_suite(s, Path(args.results)) for s in args.suite or []]
    made = shaped_suite(args)
    if made:
        record = Path(args.results) / made[0].name / RECORD
        given.append(str(record) if record.is_file() else made[0].name)
    return given


def cmd_sweep(args) -> int:
    from quest_bench.suite import load_suite
    from quest_bench.sweep import check_sweep_args, dry_run, run_sweep

    check_run_options(args)
    check_sweep_args(args.max_retries, args.run_timeout)
    check_results_folder(Path(args.results))
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ and not Path(args.results).is_absolute():
        raise ValueError(f"--results {args.results} is relative, and under `ray job submit` it would resolve inside "
                         "the job's temporary working folder on the head node (lost when the job ends); give an "
                         "absolute path on the shared filesystem, e.g. --results /shared/results")
    made = shaped_suite(args, required=True)
    if bool(made) == bool(args.suite):
        raise ValueError("sweep needs --suite NAME|FILE, or --task TASK with --variants, --seeds, --preset, --set, "
                         "--grid (a suite made on the command line), not both")
    suite = made[0] if made else load_suite(args.suite)
    if args.dry_run:  # a plan: no Ray, no GPU needed (checked against cluster manifests instead)
        print(dry_run(suite, Path(args.results), args.device, args.workers, args.data_root, args.cluster,
                      args.gpu_tflops))
        return 0
    from quest_bench.registry import check_data

    # before Ray starts; a remote cluster's workers may see other folders than this machine
    check_data(suite.specs, args.data_root, look=not (args.address or os.environ.get("RAY_ADDRESS")))
    if args.device == "cuda" and not (args.address or os.environ.get("RAY_ADDRESS")):
        check_device("cuda")  # a local sweep: this machine must have one
    if made:
        from quest_bench.suite import record_cli_suite

        print(f"suite {suite.name}, made on the command line: recorded in "
              f"{record_cli_suite(*made, Path(args.results))}; `quest-bench leaderboard --suite {suite.name}` and the "
              "same options find it", file=sys.stderr)
    counts = run_sweep(suite, Path(args.results), address=args.address, data_root=args.data_root,
                       max_retries=args.max_retries, run_timeout=args.run_timeout, wait=args.wait,
                       wait_for_resources=args.wait_for_resources, progress=not args.quiet, device=args.device,
                       workers=args.workers, checkpoint_every=args.checkpoint_every, storage=args.storage)
    print(f"suite {suite.name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0 if counts["failed"] == 0 else 1


def suite_selection(runs, given: list[str]) -> tuple[set[str], tuple[str, ...], tuple[int, ...]]:
    """The run ids of the suites ``given`` (names or files) as defined now (same specs, same code versions; stage 2
    of a confirming suite once due), the tuning keys of the first tuned one and the stage-2 seeds of the first
    confirming one. A suite with no file (e.g. results copied from a cluster): every run stored under its name."""
    from quest_bench.suite import load_suite, suite_name
    from quest_bench.tuning import confirmation_specs

    run_ids: set[str] = set()
    tune: tuple[str, ...] = ()
    confirm: tuple[int, ...] = ()
    for name in given:
        try:
            suite = load_suite(name)
            run_ids |= {spec.run_id for spec in suite.specs}
            run_ids |= {spec.run_id for spec in confirmation_specs(suite, runs.results)[0]}  # stage 2, once due
            tune, confirm = tune or suite.tune, confirm or suite.confirm
        except ValueError as err:
            if "unknown suite" not in str(err):
                raise
            run_ids |= {r.run_id for r in runs.results if runs.suites[r.run_id] == suite_name(name)}
    return run_ids, tune, confirm


def include_published(runs, run_ids: set[str], folders: list[str], tune: tuple[str, ...], confirm: tuple[int, ...],
                      figures_dir: Path) -> dict[str, dict]:
    """Add the runs of already published suites (``publish --include DIR``) to ``runs`` and ``run_ids``; returns
    their curve means by board title. Each must tune and confirm as the suites published with it do, and hold none
    of their tasks (a board's curves are averaged over all its runs, which a publication no longer has)."""
    from quest_bench.publish import published_runs

    curves: dict[str, dict] = {}
    for i, folder in enumerate(folders or []):
        published, means, manifest = published_runs(Path(folder), figures_dir / str(i))
        theirs = (tuple(manifest.get("tune", ())), tuple(manifest.get("confirm", ())))
        if theirs != (tune, confirm):
            raise ValueError(f"--include {folder} tunes {list(theirs[0]) or 'nothing'} and confirms on seeds "
                             f"{list(theirs[1]) or 'none'}; the suites published with it tune {list(tune) or 'nothing'}"
                             f" and confirm on {list(confirm) or 'none'}: one leaderboard decides only alike protocols")
        shared = {(r.task, r.preset) for r in published.results} & {
            (r.task, r.preset) for r in runs.results if r.run_id in run_ids}
        if shared:
            raise ValueError(f"--include {folder} already holds {', '.join(f'{t} ({p})' for t, p in sorted(shared))}"
                             ", which the suites given run too: publish that task from one place")
        runs.merge(published)
        run_ids |= {r.run_id for r in published.results}
        curves.update(means)
    return curves


def cmd_publish(args) -> int:
    """`publish --suite S`: the suite's runs as data in <out>/S (quest_bench.publish); several suites (repeated
    --suite) together in <out>/<--name>, one leaderboard across their tasks, if they tune and confirm alike."""
    from quest_bench.publish import folder_bytes, publish
    from quest_bench.runs import collect
    from quest_bench.spec import check_name
    from quest_bench.suite import suite_name

    check_results_folder(Path(args.results))
    names = [suite_name(s) for s in args.suite]
    if (len(names) > 1 or args.include) and not args.name:
        raise ValueError(f"publishing {len(names) + len(args.include or [])} suites together needs --name NAME: the "
                         "folder and title of the publication")
    name = check_name("publication (--name)", args.name) if args.name else names[0]
    for suite in names:
        if not (Path(args.results) / suite / "runs").is_dir():
            raise ValueError(f"no results for suite {suite!r} under {args.results}; run `quest-bench sweep --suite "
                             f"{suite}` first, or pass --results FOLDER")
    runs = collect(Path(args.results), names, False)
    protocols = {suite: suite_selection(runs, [given])[1:] for suite, given in zip(names, args.suite)}
    if len(set(protocols.values())) > 1:
        raise ValueError("suites published together must tune and confirm alike (one leaderboard decides them "
                         "together); tune keys and stage-2 seeds: " + "; ".join(
                             f"{suite}: tune {list(t) or 'none'}, confirm {list(c) or 'none'}"
                             for suite, (t, c) in protocols.items()))
    run_ids, tune, confirm = suite_selection(runs, args.suite)
    run_ids = runs.matching(run_ids)
    with tempfile.TemporaryDirectory() as figures_dir:
        curves = include_published(runs, run_ids, args.include, tune, confirm, Path(figures_dir))
        folder = publish(runs, run_ids, name, Path(args.out), tune, confirm, curves)
    print(f"published {name}: {folder} ({folder_bytes(folder):,} bytes); regenerate its leaderboard with "
          f"`quest-bench leaderboard --from {folder}`")
    return 0


def cmd_leaderboard_from(args) -> int:
    """`leaderboard --from DIR`: a published suite's leaderboard, regenerated from that folder alone."""
    from quest_bench.publish import leaderboard_from

    if args.suite or args.adhoc or getattr(args, "task", None):
        raise ValueError("leaderboard --from DIR reads a published suite alone: leave out --suite, --task and --adhoc")
    out = leaderboard_from(Path(args.published), Path(args.out) if args.out else None)
    print(f"leaderboard: {out / 'README.md'}" + (f"\n             {out / 'index.html'}"
                                                 if (out / "index.html").exists() else ""))
    return 0


def cmd_leaderboard(args) -> int:
    from quest_bench.leaderboard import write_leaderboard
    from quest_bench.runs import ADHOC, adhoc_runs, collect
    from quest_bench.suite import suite_name

    if args.published:  # a published suite's folder alone
        return cmd_leaderboard_from(args)
    existing_results(Path(args.results))
    args.suite = given_suites(args)
    if not args.suite and not args.adhoc:
        raise ValueError("leaderboard needs --suite NAME (repeat to merge suites) and/or --adhoc")
    names = [suite_name(s) for s in args.suite or []]
    for name in names:
        if not (Path(args.results) / name / "runs").is_dir():
            raise ValueError(f"no results for suite {name!r} under {args.results}; run `quest-bench sweep --suite "
                             f"{name}` first")
    runs = collect(Path(args.results), names, False) if names else adhoc_runs(Path(args.results))
    if names and args.adhoc:
        runs.merge(adhoc_runs(Path(args.results)))
    run_ids, tune, confirm = suite_selection(runs, args.suite or [])
    if args.adhoc:
        run_ids |= {r.run_id for r in runs.results if runs.suites[r.run_id] == ADHOC}
    title = "+".join(names + ([ADHOC] if args.adhoc else []))
    folder = names[0] if len(names) == 1 and not args.adhoc else ADHOC if not names else f"merged-{slug(title)}"
    out = Path(args.out) if args.out else Path(args.results) / folder / "leaderboard"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    out = write_leaderboard(runs, title, runs.matching(run_ids), out, tune, confirm)  # with runs stored under older ids
    print((out / "README.md").read_text())
    print(f"leaderboard: {out / 'README.md'}\n             {out / 'index.html'}")
    return 0


def cmd_runs(args) -> int:
    from quest_bench.runs import collect, list_table

    from quest_bench.suite import suite_name

    existing_results(Path(args.results))
    names = [suite_name(s) for s in given_suites(args)]
    print(list_table(collect(Path(args.results), names, args.adhoc), args.task, args.variant, args.status))
    return 0


def cmd_show(args) -> int:
    from quest_bench.runs import collect, find_run, show_text

    runs = collect(existing_results(Path(args.results)))
    print(show_text(runs, find_run(runs, args.run_id)))
    return 0


def cmd_compare(args) -> int:
    from quest_bench.runs import collect, compare_text, find_run

    if len(args.run_ids) < 2:
        raise ValueError("compare needs at least two run ids")
    runs = collect(existing_results(Path(args.results)))
    print(compare_text(runs, [find_run(runs, i) for i in args.run_ids], args.all))
    return 0


def cmd_pairs(args) -> int:
    """`pairs`: two variants of one suite tested against each other, per level of a grid key and pooled."""
    from quest_bench.pairs import report
    from quest_bench.publish import RUNS, read_table, result_of
    from quest_bench.runs import collect
    from quest_bench.suite import suite_name

    if bool(args.suite) == bool(args.published):
        raise ValueError("pairs reads one suite: give --suite NAME (stored results) or --from DIR (a published suite)")
    a, b = parse_pair(args.variants)
    if args.published:
        results = [result_of(row) for row in read_table(Path(args.published) / RUNS)]
    else:
        results = collect(existing_results(Path(args.results)), [suite_name(args.suite)]).results
    if not results:
        raise ValueError(f"no runs found for suite {args.suite or args.published!r}")
    print(report(results, a, b, args.metric, args.by))
    return 0


def parse_pair(text: str) -> tuple[str, str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if len(names) != 2 or names[0] == names[1]:
        raise ValueError(f"--variants takes two different variants as A,B (e.g. quest,qknorm), got {text!r}")
    return names[0], names[1]


def cmd_export(args) -> int:
    from quest_bench.runs import ADHOC, collect, export

    from quest_bench.suite import suite_name

    existing_results(Path(args.results))
    suites = [suite_name(s) for s in given_suites(args)]
    if not suites and not args.adhoc:
        raise ValueError("export needs --suite NAME (repeatable) and/or --adhoc")
    runs = collect(Path(args.results), suites, args.adhoc)
    names = [*suites, *([ADHOC] if args.adhoc else [])]
    folder = names[0] if len(names) == 1 and not args.adhoc else "exports"
    if args.out == "-":  # standard output: the rows only, the count on stderr
        print(f"{export(runs, None, args.format)} runs", file=sys.stderr)
        return 0
    out = Path(args.out) if args.out else Path(args.results) / folder / f"{slug('+'.join(names))}.{args.format}"
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name")
    print(f"{export(runs, out, args.format)} runs -> {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quest-bench", description="QUEST attention benchmark runner.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tasks", help="list tasks, presets, metrics and variants").set_defaults(fn=cmd_tasks)

    suites = sub.add_parser("suites", help="list the suites with their size and estimated cost")
    suites.add_argument("--results", default="results", help="where earlier runs are (for the cost estimate)")
    suites.set_defaults(fn=cmd_suites)
    config = sub.add_parser("config", help="a task's config keys: resolved value, type, valid values, meaning")
    config.add_argument("task")
    config.add_argument("--preset", default="tiny", help="one of the task's presets (default tiny)")
    config.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    config.add_argument("--format", default="table", choices=["table", "yaml", "json"])
    config.set_defaults(fn=cmd_config)

    import quest_core

    from quest_bench.registry import task_names

    run = sub.add_parser("run", help="run one task in this process (no Ray)",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=f"tasks: {', '.join(task_names())}\nvariants: {', '.join(quest_core.list_variants())}"
                                "\nconfig keys of a task: quest-bench config TASK")
    run.add_argument("task", nargs="?", help="task name (see `quest-bench tasks`), or use --spec")
    run.add_argument("--spec", help="repeat a run exactly from its spec.json (with its data root and thread count)")
    run.add_argument("--attention", help="attention variant (default quest; see `quest-bench tasks`)")
    run.add_argument("--preset", help="one of the task's presets, e.g. tiny, small, paper (default tiny)")
    run.add_argument("--seed", type=int, help="default 0")
    run.add_argument("--threads", type=int, help="torch threads (default: the preset's, as in a sweep; --spec: the recorded count)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a task config key")
    run.add_argument("--data-root", help="folder with real datasets (defaults use shipped or generated data)")
    run.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    run.add_argument("--workers", type=int, help="data-parallel workers through Ray Train (default: the preset's, "
                     "usually 1 = this process, no Ray)")
    run.add_argument("--max-failures", type=int, default=2, help="with --workers: restarts after a worker dies, "
                     "each from the last checkpoint (default 2)")
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                     help="steps between checkpoints (default 0: ten per run, plus the end)")
    run.add_argument("--out", help="run folder (default: results/adhoc/<task>-<variant>-<run_id>); must be new, "
                     "empty, or hold the same spec (a finished run is not repeated, an unfinished one runs again)")
    run.add_argument("--force", action="store_true", help="replace an earlier run in --out (a folder with a "
                     "spec.json), or run a finished one again")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(fn=cmd_run)

    sweep = sub.add_parser("sweep", help="run a suite (tasks × variants × seeds × presets × grid) on Ray")
    sweep.add_argument("--suite", help="suite name (configs/suites/NAME.yaml) or path; or make one with --task")
    add_shape_args(sweep, "a suite made on the command line: this task, with the options below")
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
    sweep.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                       help="auto (default): CUDA for presets that ask for GPUs; cpu/cuda for every run")
    sweep.add_argument("--workers", type=int, help="data-parallel workers per run (default: each preset's)")
    sweep.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                       help="steps between checkpoints (default 0: ten per run, plus the end)")
    sweep.add_argument("--dry-run", action="store_true", help="list the runs to do and their resources; run nothing")
    sweep.add_argument("--cluster", action="append", metavar="FILE", help="with --dry-run: a Ray cluster-launcher "
                       "or KubeRay manifest to check placements against (repeatable; default: infra/'s manifests)")
    sweep.add_argument("--gpu-tflops", type=float, metavar="TFLOPS", help="with --dry-run: the sustained training "
                       "rate per GPU the GPU-hour estimates assume (default: an assumption; see docs/cluster.md)")
    sweep.add_argument("--storage", metavar="URI", help="keep run folders at this URI while they train (s3://, gs://, "
                       "file://; through pyarrow.fs), for nodes that do not mount --results; the driver copies each "
                       "finished run's folder into --results")
    sweep.add_argument("--quiet", action="store_true")
    sweep.set_defaults(fn=cmd_sweep)

    board = sub.add_parser("leaderboard", help="aggregate results into Markdown + HTML: one suite, several merged "
                           "(--suite A --suite B), or the ad-hoc runs (--adhoc)")
    board.add_argument("--suite", action="append", help="suite name or file (repeat to merge suites)")
    add_shape_args(board, "the suite `sweep --task ...` made with the same options")
    board.add_argument("--adhoc", action="store_true", help="the runs of `quest-bench run` under <results>/adhoc")
    board.add_argument("--results", default="results")
    board.add_argument("--out", help="output folder (default: <results>/<suite>/leaderboard; with --from: "
                       "DIR/leaderboard)")
    board.add_argument("--from", dest="published", metavar="DIR", help="regenerate a published suite's leaderboard "
                       "from its folder alone (docs/results/<suite>, written by `quest-bench publish`)")
    board.set_defaults(fn=cmd_leaderboard)

    pub = sub.add_parser("publish", help="a suite's runs as data to commit: run table, curves, leaderboard tables "
                         "and figures in docs/results/<suite> (see docs/results.md)")
    pub.add_argument("--suite", required=True, action="append", help="suite name or file (repeat, with --name, "
                     "to publish suites that tune and confirm alike as one leaderboard across their tasks)")
    pub.add_argument("--name", help="the folder and title of suites published together (default: the suite's name)")
    pub.add_argument("--include", action="append", metavar="DIR", help="a published suite (docs/results/<suite>) "
                     "whose runs join this publication, as if their suite were given (repeatable; it must tune and "
                     "confirm alike and hold other tasks): adds tasks to a publication whose results folder is gone")
    pub.add_argument("--results", default="results", help="results folder (default: ./results)")
    pub.add_argument("--out", default="docs/results", help="where the suite's folder goes (default: docs/results)")
    pub.set_defaults(fn=cmd_publish)

    runs = sub.add_parser("runs", help="list finished runs (all suites and ad-hoc runs by default)")
    runs.add_argument("--suite", action="append", help="only this suite (repeatable)")
    runs.add_argument("--adhoc", action="store_true", help="only the ad-hoc runs (with --suite: those as well)")
    runs.add_argument("--task", help="only this task; with the options below: the suite `sweep --task ...` made")
    runs.add_argument("--variant")
    add_shape_args(runs)
    runs.add_argument("--status", choices=["ok", "diverged", "failed"])
    runs.add_argument("--results", default="results")
    runs.set_defaults(fn=cmd_runs)
    show = sub.add_parser("show", help="one run: spec, outcome, metrics, cost, environment, files")
    show.add_argument("run_id", help="a run id or its first characters (at least 4)")
    show.add_argument("--results", default="results")
    show.set_defaults(fn=cmd_show)
    compare = sub.add_parser("compare", help="runs side by side, differing config keys marked")
    compare.add_argument("run_ids", nargs="+")
    compare.add_argument("--all", action="store_true", help="every config key, not only the differing ones")
    compare.add_argument("--results", default="results")
    compare.set_defaults(fn=cmd_compare)
    pairs = sub.add_parser("pairs", help="two variants tested against each other, paired on (seed, other overrides): "
                           "per level of a grid key (--by) and pooled")
    pairs.add_argument("--suite", help="suite name or file (stored results)")
    pairs.add_argument("--from", dest="published", metavar="DIR", help="a published suite (docs/results/<suite>)")
    pairs.add_argument("--variants", required=True, help="A,B: the two variants, e.g. quest,qknorm")
    pairs.add_argument("--by", help="a grid key: one test per value (Holm-corrected across them) and one pooled")
    pairs.add_argument("--metric", help="the metric to compare (default: each task's primary metric)")
    pairs.add_argument("--results", default="results")
    pairs.set_defaults(fn=cmd_pairs)
    exp = sub.add_parser("export", help="one row per run with flattened metrics, as CSV, JSON or Parquet")
    exp.add_argument("--suite", action="append", help="suite name or file (repeatable)")
    add_shape_args(exp, "the suite `sweep --task ...` made with the same options")
    exp.add_argument("--adhoc", action="store_true")
    exp.add_argument("--format", default="csv", choices=["csv", "json", "parquet"])
    exp.add_argument("--out", help="file, or - for standard output (default: <results>/<suite>/<suite>.<format>)")
    exp.add_argument("--results", default="results")
    exp.set_defaults(fn=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every user error ends in one line on stderr and exit status 2; Ctrl-C in one line and 130, SIGTERM the same
    way and 143 (the shell's codes): a sweep cancels its runs, and the same command resumes it."""
    args = build_parser().parse_args(argv)
    stopped_by = []

    def on_sigterm(signum, frame):  # `kill`, a scheduler's preemption: stop like Ctrl-C (a background job's
        stopped_by.append(signum)   # SIGINT is ignored by the shell that started it)
        raise KeyboardInterrupt

    from quest_bench.sweep import RayStartError

    in_main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main_thread else None
    try:
        return args.fn(args)
    except ValueError as err:
        return fail(str(err))
    except RayStartError as err:  # not the user's doing: exit 1, like a failed run
        print(f"quest-bench: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        sys.stderr.close()
        return 0
    except OSError as err:  # disk full, permission denied, a path that is not a folder, ...
        where = f": {err.filename}" if err.filename else ""
        return fail(f"{err.strerror or err}{where}")
    except KeyboardInterrupt:  # Ray may re-raise it as a plain KeyboardInterrupt: which signal is in stopped_by
        print("quest-bench: interrupted; finished runs are saved, run the same command again to resume",
              file=sys.stderr)
        return 128 + (stopped_by[0] if stopped_by else signal.SIGINT)
    finally:
        if in_main_thread:  # None: a handler not set from Python, i.e. the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def fail(message: str) -> int:
    print(f"quest-bench: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
