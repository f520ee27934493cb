"""[project.dependencies] is what nri_cni imports at run time, and nothing else: read from the
code's import statements (ast) and the installed distributions' metadata."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nri_cni"
# Developer tools inside the package, run from a checkout with the test extra installed.
DEV_TOOLS = PACKAGE / "tools"


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def third_party_imports(files: list[Path]) -> set[str]:
    """Top-level names of the modules imported (anywhere in the file) that are not the stdlib's
    nor the project's own (nri_cni, tests, bench)."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in ("nri_cni", "tests", "bench")}


def distributions_of(imports: set[str]) -> set[str]:
    dists = packages_distributions()
    missing = sorted(n for n in imports if n not in dists)
    assert not missing, f"imported but installed by no distribution: {missing}"
    return {d.lower().replace("_", "-") for n in imports for d in dists[n]}


def runtime_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if DEV_TOOLS not in p.parents]


def test_runtime_dependencies_are_what_the_package_imports():
    declared = {_requirement_name(s) for s in _pyproject()["project"]["dependencies"]}
    imported = distributions_of(third_party_imports(runtime_files()))
    assert imported == declared, f"imported {sorted(imported)}, declared {sorted(declared)}"


def test_what_only_tests_and_tools_import_is_in_the_test_extra():
    project = _pyproject()["project"]
    test_extra = {_requirement_name(s) for s in project["optional-dependencies"]["test"]}
    runtime = distributions_of(third_party_imports(runtime_files()))
    others = list((ROOT / "tests").rglob("*.py")) + list((ROOT / "bench").glob("*.py"))
    others += list(DEV_TOOLS.rglob("*.py"))
    needed = distributions_of(third_party_imports(others)) - runtime
    assert needed <= test_extra, (
        f"imported by tests/bench/tools, not in the test extra: {sorted(needed - test_extra)}"
    )
    # the node inspector (nri_cni/node) speaks netlink itself: pyroute2 (~10 MiB) is the tests'
    assert "pyroute2" not in runtime and "pyroute2" in test_extra


def test_constraints_pin_every_declared_dependency():
    project = _pyproject()["project"]
    pinned = {
        _requirement_name(line)
        for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    declared = {_requirement_name(s) for s in project["dependencies"]}
    declared |= {_requirement_name(s) for s in project["optional-dependencies"]["test"]}
    assert declared <= pinned, f"not pinned in requirements/constraints.txt: {sorted(declared - pinned)}"
