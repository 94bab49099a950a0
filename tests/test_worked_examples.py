"""The worked examples of docs/adding-a-variant.md and docs/adding-a-task.md do what the pages say.

Blocks marked ```python example``` run in order as one script; ```bash example``` blocks run as shell commands;
```<lang> file=PATH``` blocks are the files of a project, written to PATH under a fresh folder."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import REPO, cli_env

FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(page: str, lang: str, info: str) -> list[str]:
    """The bodies of docs/<page>'s fenced ``lang`` blocks whose info string (after the language) is ``info``."""
    return [body for kind, rest, body in FENCE.findall((REPO / "docs" / page).read_text())
            if kind == lang and rest.strip() == info]


def files(page: str) -> dict[str, str]:
    """The page's ``file=PATH`` blocks, by path."""
    out = {}
    for _, rest, body in FENCE.findall((REPO / "docs" / page).read_text()):
        if rest.strip().startswith("file="):
            out[rest.strip().removeprefix("file=")] = body
    return out


def clean_env(**extra) -> dict:
    env = cli_env(**extra)
    env.pop("QUEST_BENCH_ROOT", None)  # the project folder is the command's working directory
    return env


def shell(script: str, cwd: Path, env: dict) -> str:
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{script}\n---\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_variant_page_registers_checks_trains_and_compares_its_variant(tmp_path):
    script = "\n\n".join(blocks("adding-a-variant.md", "python", "example"))
    for step in ("register_variant", "assert_close", "execute(", "write_leaderboard"):
        assert step in script, f"the page no longer shows {step}"
    (tmp_path / "page.py").write_text(script)
    done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "quest-gain matches the float64 reference" in lines
    runs = sorted(tuple(line.split()[:3]) for line in lines if re.match(r"(softmax|quest-gain) \d+ ", line))
    assert runs == [("quest-gain", "0", "ok"), ("quest-gain", "1", "ok"), ("softmax", "0", "ok"), ("softmax", "1", "ok")]
    board = (tmp_path / "results" / "quest-gain-vs-softmax" / "leaderboard" / "README.md").read_text()
    header = next(line for line in board.splitlines() if line.startswith("| variant |"))
    delta = [c.strip() for c in header.strip("|").split("|")].index("Δ vs softmax")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in board.splitlines() if re.match(r"\| (softmax|quest-gain) \|", line)}
    assert rows["softmax"][1] == rows["quest-gain"][1] == "2"  # both variants, each with its n
    assert "(n=2;" in rows["quest-gain"][delta] and "McNemar p=" in rows["quest-gain"][delta]  # paired by seed


def install(project: Path, pyproject: Path) -> list[str]:
    """What installing the package at ``pyproject`` gives Python: its distribution metadata with the entry points
    (a ``.dist-info`` folder, as an installer writes it) and its source folder on the path. Returns PYTHONPATH."""
    meta = tomllib.loads(pyproject.read_text())
    project_meta = meta["project"]
    site = project / "site"
    dist = site / f"{project_meta['name'].replace('-', '_')}-{project_meta['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project_meta['name']}\n"
                                   f"Version: {project_meta['version']}\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in project_meta["entry-points"].items()))
    sources = [str((pyproject.parent / p).parent) for p in meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]]
    return [str(site), *sources]


@pytest.mark.slow
def test_the_task_page_builds_a_task_that_runs_and_joins_a_suite(tmp_path):
    written = files("adding-a-task.md")
    assert {"tasks/majority/pyproject.toml", "configs/suites/majority.yaml"} <= set(written)
    for path, body in written.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    commands = blocks("adding-a-task.md", "bash", "example")
    assert len(commands) == 2

    before = shell("quest-bench tasks", tmp_path, clean_env())  # not installed: not a task
    assert not re.search(r"^majority ", before, re.M)

    env = clean_env(PYTHONPATH=os.pathsep.join(install(tmp_path, tmp_path / "tasks/majority/pyproject.toml")))
    out = shell(commands[0], tmp_path, env)
    assert re.search(r"^majority  \(v1\)  primary: test_acc \(higher is better\)", out, re.M), out
    assert re.search(r"\bsteps\b.*\b50\b", out), out  # `config --set steps=50` shows the value
    run = tmp_path / "results" / "majority-quest"
    result = json.loads((run / "result.json").read_text())
    assert (result["task"], result["variant"], result["status"]) == ("majority", "quest", "ok"), result["reason"]
    assert result["primary_metric"] == "test_acc" and result["validation_metric"] == "valid_acc"
    assert 0.0 <= result["metrics"]["test_acc"] <= 1.0 and 0.0 <= result["metrics"]["valid_acc"] <= 1.0
    assert result["config"]["steps"] == 200  # the tiny preset
    assert (run / "spec.json").exists() and (run / "events.jsonl").read_text().strip()

    out = shell(commands[1], tmp_path, env)
    assert "suite majority: 6 runs, 6 to run" in out, out
