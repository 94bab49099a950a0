"""The project folder (``quest_bench.paths``): named suites, cluster manifests and the recorded git sha come from
``QUEST_BENCH_ROOT`` or the current directory, never from where the installed code happens to live."""

import subprocess

import pytest

from quest_bench.paths import ROOT_ENV, project_root
from quest_bench.runner import git_state
from quest_bench.suite import find_suite, known_suites


def write_project(root, name="mine"):
    (root / "configs" / "suites").mkdir(parents=True)
    path = root / "configs" / "suites" / f"{name}.yaml"
    path.write_text(f"name: {name}\ntasks: [spurious]\nvariants: [softmax]\nseeds: [0]\n")
    return path


def test_named_suites_come_from_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOT_ENV, raising=False)
    path = write_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert project_root() == tmp_path
    assert known_suites() == {"mine": path}
    assert find_suite("mine") == path


def test_the_root_setting_wins_over_the_current_directory(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    path = write_project(project)
    write_project(elsewhere, "other")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(ROOT_ENV, str(project))
    assert known_suites() == {"mine": path}


def test_an_unknown_suite_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        find_suite("smoke")
    assert f"looked for smoke.yaml in {tmp_path / 'configs' / 'suites'}" in str(err.value)
    assert ROOT_ENV in str(err.value)
    with pytest.raises(ValueError, match=f"looked for {tmp_path / 'nope.yaml'}"):
        find_suite("nope.yaml")


def test_a_root_setting_that_is_not_a_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=f"{ROOT_ENV}=.*missing.* is not a folder"):
        project_root()


def test_the_git_sha_is_the_project_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("QUEST_BENCH_GIT_SHA", raising=False)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    assert git_state() == {"git_sha": "unknown", "git_dirty": None}  # not a checkout: no sha is made up
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert git_state() == {"git_sha": sha, "git_dirty": False}


def test_ray_train_workers_get_the_project_folder(tmp_path, monkeypatch):
    from quest_bench.distributed import _worker_env

    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert _worker_env()[ROOT_ENV] == str(tmp_path)  # a worker elsewhere still reads this project's git sha
