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
