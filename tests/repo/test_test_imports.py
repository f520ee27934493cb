"""One test bed: no test module imports another (helpers and fixtures shared by several live in
tests/support or a conftest.py). Read from the code with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_test_modules(source: str) -> list[str]:
    """The test modules (a `test_*` last component) that `source` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [
            n for n in names if n.startswith(("tests.", "bench.")) and n.split(".")[-1].startswith("test_")
        ]
    return found


@pytest.mark.parametrize(
    "source,found",
    [
        ("from tests.support.conflists import network\n", []),
        ("import tests.support.names\n", []),
        ("from tests.e2e.test_pod_shim import run_pod\n", ["tests.e2e.test_pod_shim"]),
        # the control case of the line above: the same name from a support module
        ("from tests.support.shimnode import run_pod\n", []),
        ("from tests.unit.cni import test_cni_cache\n", ["tests.unit.cni.test_cni_cache"]),
        ("import tests.unit.daemon.test_reload as r\n", ["tests.unit.daemon.test_reload"]),
    ],
)
def test_the_check_finds_an_import_of_a_test_module(source, found):
    assert imported_test_modules(source) == found


def test_no_test_module_imports_another():
    offenders = {
        str(path.relative_to(ROOT)): hits
        for top in ("tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "/.venv/" not in str(path) and (hits := imported_test_modules(path.read_text()))
    }
    assert offenders == {}
