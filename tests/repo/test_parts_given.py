"""Parts are given, not built: no constructor in nri_cni/ makes a collaborator when its caller
gave none (`self.x = x or X()`); the composition root (nri_cni/daemon/app.py) passes each one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def built_fallbacks(source: str, filename: str) -> list[str]:
    """Each `<value> or <Capitalized>(...)` inside an __init__, as file:line: text."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.FunctionDef) and node.name == "__init__"):
            continue
        for inner in ast.walk(node):
            if not (isinstance(inner, ast.BoolOp) and isinstance(inner.op, ast.Or)):
                continue
            for value in inner.values[1:]:
                if isinstance(value, ast.Call):
                    func = value.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    if name[:1].isupper():
                        found.append(f"{filename}:{inner.lineno}: {ast.unparse(inner)}")
    return found


def test_the_check_finds_a_part_built_as_a_fallback():
    built = "class A:\n    def __init__(self, pool=None):\n        self.pool = pool or Pool(4)\n"
    given = "class A:\n    def __init__(self, pool):\n        self.pool = pool\n"
    assert built_fallbacks(built, "a.py") == ["a.py:3: pool or Pool(4)"]
    assert built_fallbacks(given, "a.py") == []  # control: the same class given its part


def test_no_constructor_in_the_product_builds_a_part_it_was_not_given():
    found = []
    for path in sorted((ROOT / "nri_cni").rglob("*.py")):
        found += built_fallbacks(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []
