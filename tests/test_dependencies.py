"""Every workspace package declares what it imports and imports what it declares.

An AST scan of each member's ``src/`` (and ``tests/``) finds the top-level modules it imports (at module level or
inside functions); ``importlib.metadata.packages_distributions()`` maps them to the installed distributions; the
pyproject's ``[project] dependencies`` and optional dependencies (``src/``), plus its dependency groups and the root's
``dev`` group (``tests/``), must name every one. A required dependency that no file of ``src/`` imports must be
listed in ``IMPORTED_BY_OTHERS`` with the reason.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = sorted(p.parent for pattern in ("packages/*/pyproject.toml", "tasks/*/pyproject.toml")
                 for p in ROOT.glob(pattern))

# Import names that more than one installed distribution provides (cv2: opencv-python and its -headless twin) ->
# the one a pyproject should name; none of the workspace's imports needs an entry today.
IMPORT_TO_DISTRIBUTION: dict[str, str] = {}

# Declared without being imported by the member's own code: (member, distribution) -> why.
IMPORTED_BY_OTHERS = {
    ("quest-segmentation", "ftfy"): "mmsegmentation imports it without declaring it",
    ("quest-segmentation", "regex"): "mmsegmentation imports it without declaring it",
    ("quest-image-cls", "multiprocess"): "ART's AutoAttack imports it without declaring it",
    ("quest-sdk", "tensorboard"): "torch.utils.tensorboard's SummaryWriter needs it and torch does not declare it",
}


def pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def declared_for_src(folder: Path) -> set[str]:
    """Required and optional (extras) dependencies."""
    project = pyproject(folder)["project"]
    declared = names(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        declared |= names(extra)
    return declared


def declared_for_tests(folder: Path) -> set[str]:
    """What src/ may import, the member's dependency groups and the root's dev group."""
    declared = declared_for_src(folder) | names(pyproject(ROOT)["dependency-groups"]["dev"])
    for group in pyproject(folder).get("dependency-groups", {}).values():
        declared |= names(group)
    return declared


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Top-level module -> the files (relative to ROOT) that import it, over every ``*.py`` under ``folder``;
    relative imports are skipped."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                found.setdefault(module.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def distributions(modules: dict[str, set[str]], local: set[str]) -> dict[str, set[str]]:
    """The distributions (canonical names) behind third-party modules -> the importing files; stdlib modules and
    ``local`` ones (the folder's own, test helpers) are left out, and a module no installed distribution provides
    is an error."""
    installed = packages_distributions()
    out: dict[str, set[str]] = {}
    for module, files in modules.items():
        if module in sys.stdlib_module_names or module in local:
            continue
        if module in IMPORT_TO_DISTRIBUTION:
            dist = IMPORT_TO_DISTRIBUTION[module]
        else:
            # one distribution may be listed more than once (found on two sys.path entries): dedupe by name
            candidates = sorted({canonicalize_name(d) for d in installed.get(module, [])})
            if len(candidates) != 1:
                raise AssertionError(f"module {module!r} (imported by {sorted(files)}) is provided by "
                                     f"{candidates or 'no installed distribution'}; add it to IMPORT_TO_DISTRIBUTION")
            dist = candidates[0]
        out.setdefault(canonicalize_name(dist), set()).update(files)
    return out


def own_modules(folder: Path) -> set[str]:
    return {p.name for p in (folder / "src").iterdir() if p.is_dir()}


def local_test_modules() -> set[str]:
    """Modules the test suite puts on sys.path itself (pytest's ``pythonpath``) or that live beside the tests."""
    paths = pyproject(ROOT)["tool"]["pytest"]["ini_options"]["pythonpath"]
    local = {p.stem for entry in paths for p in (ROOT / entry).glob("*.py")}
    return local | {p.stem for p in ROOT.glob("*/*/tests/*.py")} | {p.stem for p in ROOT.glob("tests/*.py")}


def workspace_modules() -> set[str]:
    return {name for member in MEMBERS for name in own_modules(member)}


def member_name(folder: Path) -> str:
    return canonicalize_name(pyproject(folder)["project"]["name"])


def module_owner() -> dict[str, str]:
    return {module: member_name(member) for member in MEMBERS for module in own_modules(member)}


@pytest.mark.parametrize("member", MEMBERS, ids=lambda p: p.name)
def test_every_import_of_src_is_declared(member):
    declared = declared_for_src(member)
    owners = module_owner()
    own = own_modules(member)
    modules = imported_modules(member / "src")
    workspace = {owners[m] for m in modules if m in owners and m not in own}
    third_party = distributions(modules, workspace_modules())
    missing = {d: sorted(f) for d, f in third_party.items() if d not in declared}
    missing |= {d: "(workspace member)" for d in workspace if d not in declared}
    assert not missing, f"{member_name(member)} imports undeclared distributions: {missing}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda p: p.name)
def test_nothing_is_declared_that_src_does_not_import(member):
    project = pyproject(member)["project"]
    owners = module_owner()
    modules = imported_modules(member / "src")
    used = set(distributions(modules, workspace_modules())) | {owners[m] for m in modules if m in owners}
    name = member_name(member)
    unused = sorted(d for d in names(project.get("dependencies", []))
                    if d not in used and (name, d) not in IMPORTED_BY_OTHERS)
    assert not unused, f"{name} declares distributions its src/ never imports: {unused}"
    extras = {d for extra in project.get("optional-dependencies", {}).values() for d in names(extra)}
    assert extras <= used, f"{name} has extras its src/ never imports: {sorted(extras - used)}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda p: p.name)
def test_nothing_is_in_a_dependency_group_that_tests_do_not_import(member):
    groups = {d for group in pyproject(member).get("dependency-groups", {}).values() for d in names(group)}
    if not groups:
        pytest.skip("no dependency groups")
    owners = module_owner()
    modules = imported_modules(member / "tests")
    used = set(distributions(modules, workspace_modules() | local_test_modules()))
    used |= {owners[m] for m in modules if m in owners}
    assert groups <= used, f"{member_name(member)}'s dependency groups name what its tests never import: " \
                           f"{sorted(groups - used)}"


def test_every_import_of_the_root_tests_is_declared():
    root = pyproject(ROOT)
    declared = names(root["project"]["dependencies"]) | names(root["dependency-groups"]["dev"])
    modules = imported_modules(ROOT / "tests")
    missing = {d: sorted(f) for d, f in distributions(modules, workspace_modules() | local_test_modules()).items()
               if d not in declared}
    assert not missing, f"tests/ imports distributions the root pyproject does not declare: {missing}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda p: p.name)
def test_every_import_of_tests_is_declared(member):
    if not (member / "tests").is_dir():
        pytest.skip("no tests folder")
    declared = declared_for_tests(member)
    owners = module_owner()
    modules = imported_modules(member / "tests")
    local = workspace_modules() | local_test_modules()
    missing = {d: sorted(f) for d, f in distributions(modules, local).items() if d not in declared}
    missing |= {owners[m]: "(workspace member)" for m in modules
                if m in owners and owners[m] != member_name(member) and owners[m] not in declared}
    assert not missing, (f"{member_name(member)}'s tests import distributions that neither its dependencies, extras, "
                         f"dependency groups nor the root's dev group declare: {missing}")


def test_the_reasons_for_unimported_dependencies_are_still_true():
    """Each IMPORTED_BY_OTHERS entry is declared, and its member really does not import it (else drop the entry)."""
    by_name = {member_name(m): m for m in MEMBERS}
    for member, dist in IMPORTED_BY_OTHERS:
        folder = by_name[member]
        assert dist in names(pyproject(folder)["project"]["dependencies"]), (member, dist)
        assert dist not in distributions(imported_modules(folder / "src"), workspace_modules()), (member, dist)


def test_the_scan_sees_function_level_and_from_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "m.py").write_text("import os.path\nfrom . import x\n\ndef f():\n    from yaml import safe_load\n"
                                   "    import numpy as np\n")
    assert imported_modules(tmp_path) == {"os": {"m.py"}, "yaml": {"m.py"}, "numpy": {"m.py"}}
    assert distributions(imported_modules(tmp_path), set()) == {"pyyaml": {"m.py"}, "numpy": {"m.py"}}
    with pytest.raises(AssertionError, match=r"module 'cv2' \(imported by \['m.py'\]\) is provided by \["):
        distributions({"cv2": {"m.py"}}, set())  # two installed distributions provide it: ambiguous
    with pytest.raises(AssertionError, match="no installed distribution"):
        distributions({"not_a_module_anywhere": {"m.py"}}, set())
