"""The service layer's shape (issue 31): the roster's table is the roster's alone."""

from __future__ import annotations

import ast
from pathlib import Path

from nri_cni.service.roster import Roster

ROOT = Path(__file__).resolve().parents[2]
ROSTER = ROOT / "nri_cni" / "service" / "roster.py"


def python_files() -> list[Path]:
    return sorted(p for d in ("nri_cni", "tests", "bench") for p in (ROOT / d).rglob("*.py"))


def collections_of(obj: object) -> set[str]:
    """The attributes of `obj` that hold a collection (what only its own module may touch)."""
    return {name for name, value in vars(obj).items() if isinstance(value, (dict, set, list, frozenset))}


def touches(source: str, where: str, names: set[str]) -> list[str]:
    """`where:line .attr` for each attribute access to one of `names` in `source`."""
    return [
        f"{where}:{node.lineno} .{node.attr}"
        for node in ast.walk(ast.parse(source, where))
        if isinstance(node, ast.Attribute) and node.attr in names
    ]


def test_the_roster_keeps_its_collections_private():
    names = collections_of(Roster())
    assert names and all(n.startswith("_") for n in names), names


def test_nothing_outside_the_roster_touches_its_collections():
    names = collections_of(Roster())
    found = [
        hit
        for path in python_files()
        if path != ROSTER
        for hit in touches(path.read_text(), str(path.relative_to(ROOT)), names)
    ]
    assert found == []


def test_the_check_finds_a_touch():
    """The control case: the same check on code that reaches into the roster finds it."""
    source = "def peek(roster):\n    return roster._records\n"
    assert touches(source, "probe.py", collections_of(Roster())) == ["probe.py:2 ._records"]


# the size limits of service/ and pod/ (issue 31)
MAX_METHODS = 20
MAX_LINES = 60
# known to exceed them, each to be shortened and then dropped from here (a name listed that no
# longer exceeds fails the test, so the list only shrinks)
OVERSIZED: set[str] = set()


def oversized(source: str, where: str) -> set[str]:
    """`where:Class` for a class of more than MAX_METHODS methods, `where:Class.fn` or
    `where:fn` for a function of more than MAX_LINES lines (its def to its last line)."""
    out = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                methods = [n for n in child.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_METHODS:
                    out.add(f"{where}:{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                if child.end_lineno - child.lineno + 1 > MAX_LINES:
                    out.add(f"{where}:{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source, where), "")
    return out


def test_no_class_over_20_methods_and_no_function_over_60_lines_in_service_and_pod():
    found = set()
    for package in ("service", "pod"):
        for path in sorted((ROOT / "nri_cni" / package).glob("*.py")):
            found |= oversized(path.read_text(), str(path.relative_to(ROOT)))
    assert found == OVERSIZED


def test_the_size_check_finds_a_long_function_and_a_wide_class():
    """The control cases: one line or one method more than the limits is found, at the limits not."""
    at_limit = "def f():\n" + "    x = 1\n" * (MAX_LINES - 1)
    over = "def f():\n" + "    x = 1\n" * MAX_LINES
    assert oversized(at_limit, "m.py") == set()
    assert oversized(over, "m.py") == {"m.py:f"}
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_METHODS))
    assert oversized(f"class C:\n{methods}", "m.py") == set()
    assert oversized(f"class C:\n{methods}    def one_more(self):\n        pass\n", "m.py") == {"m.py:C"}
