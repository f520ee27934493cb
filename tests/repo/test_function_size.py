"""No function over 60 lines in nri_cni/pod/ (issue #31: each verb's steps named, not inlined)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def long_functions(source: str, filename: str) -> list[str]:
    return [
        f"{filename}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]


def test_the_check_finds_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert long_functions(f"def f():\n{body}", "a.py") == []
    # control: one line more
    assert long_functions(f"def f():\n{body}    y = 0\n", "a.py") == [f"a.py:1 f ({MAX_LINES + 1} lines)"]


def test_no_function_in_the_pod_package_is_over_60_lines():
    found = []
    for path in sorted((ROOT / "nri_cni" / "pod").rglob("*.py")):
        found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []
