"""The import graph of nri_cni/, read from the code (ast; nothing is imported): no cycle, and no
import inside a function unless a `# lazy: <reason>` comment says why it is deferred.

An edge A -> B is any import of B in A: at module level, under `if TYPE_CHECKING:` (a type-only
cycle is still two modules that cannot be understood apart) or inside a function; importing
a.b.c also runs the packages a.b and a (their __init__), so those are edges too, except a
module's own packages. A module that calls importlib.import_module gets an edge to every
nri_cni module it names in a string (a registry of command modules is an import).

A function-level import is justified by a comment `# lazy: <reason>` on its line or in the
comment lines right above it, or by one on any import of the same run of consecutive import
statements (one comment covers the group a formatter keeps together).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nri_cni"
LAZY = re.compile(r"#\s*lazy:\s*\S")

# Settled by the app-layer branch: its files are restructured there, and these go
# away with it. The coordinator empties both lists after the merge; an entry that no longer
# occurs fails the test, so the lists only shrink.
KNOWN_CYCLES_UNTIL_APP_MERGE: set[frozenset[str]] = set()
KNOWN_LAZY_UNTIL_APP_MERGE = {
    ("nri_cni.cli.main", "nri_cni"),
}


@dataclass(frozen=True)
class Import:
    target: str  # the nri_cni module (or package) imported
    line: int


@dataclass(frozen=True)
class LateImport:
    """An import statement inside a function (of any module, nri_cni's or not)."""

    names: tuple[str, ...]  # as written: the modules of `import a, b`, or the module of `from m import x`
    line: int
    justified: bool  # a `# lazy:` comment covers it


@dataclass(frozen=True)
class Module:
    imports: list[Import]
    late: list[LateImport]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def lazy_lines(source: str) -> set[int]:
    """The lines a `# lazy:` comment covers: its own, and the line after its comment block."""
    comments = [
        t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT
    ]
    alone = {t.start[0] for t in comments if t.line.lstrip().startswith("#")}  # a comment line, no code
    covered: set[int] = set()
    for t in comments:
        if LAZY.match(t.string):
            line = t.start[0]
            covered.add(line)
            while line in alone:
                line += 1
            covered.add(line)
    return covered


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _resolve(module, is_package, node)
    # `from pkg import mod` imports the module pkg.mod; `from mod import name` only mod
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _with_packages(target: str, module: str) -> Iterator[str]:
    """target and the packages above it that importing it runs (not the importer's own)."""
    parts = target.split(".")
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in own and name != module:
            yield name


def _import_runs(tree: ast.AST) -> Iterator[list[ast.Import | ast.ImportFrom]]:
    """Runs of consecutive import statements in every statement list of the tree."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            run: list[ast.Import | ast.ImportFrom] = []
            for stmt in [*stmts, None]:
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    run.append(stmt)
                    continue
                if run:
                    yield run
                run = []


def _function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: dict[int, ast.Import | ast.ImportFrom] = {}  # by position: nested functions are walked twice
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    found[inner.lineno * 1000 + inner.col_offset] = inner
    return [found[k] for k in sorted(found)]


def read_module(module: str, source: str, *, is_package: bool, known: set[str]) -> Module:
    tree = ast.parse(source, module)
    covered = lazy_lines(source)
    justified: set[int] = set()
    for run in _import_runs(tree):
        if any(n.lineno in covered for n in run):
            justified.update(n.lineno for n in run)
    imports: list[Import] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for target in _targets(module, is_package, node, known):
            if target == "nri_cni" or target.startswith("nri_cni."):
                imports.extend(Import(name, node.lineno) for name in _with_packages(target, module))
    if "import_module" in source:  # importlib.import_module("nri_cni....") or a table of such names
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                imports.append(Import(node.value, node.lineno))
    late = [
        LateImport(_written_names(module, is_package, node), node.lineno, node.lineno in justified)
        for node in _function_imports(tree)
    ]
    return Module(imports, late)


def _written_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> tuple[str, ...]:
    if isinstance(node, ast.Import):
        return tuple(a.name for a in node.names)
    return (_resolve(module, is_package, node),)


def read_package() -> dict[str, Module]:
    modules = all_modules()
    known = set(modules)
    return {
        name: read_module(name, path.read_text(), is_package=path.name == "__init__.py", known=known)
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _edges(package: dict[str, Module], skip: frozenset[frozenset[str]] = frozenset()) -> dict[str, set[str]]:
    edges = {m: {i.target for i in mod.imports if i.target in package} for m, mod in package.items()}
    for pair in skip:
        a, b = sorted(pair)
        edges.get(a, set()).discard(b)
        edges.get(b, set()).discard(a)
    return edges


@pytest.fixture(scope="module")
def package() -> dict[str, Module]:
    return read_package()


def test_the_graph_sees_the_package(package):
    """Guards the checks below against reading nothing: known modules and edges are found."""
    assert {"nri_cni.ttrpc.framing", "nri_cni.nri.stub", "nri_cni.cni.runtime", "nri_cni.config"} <= set(
        package
    )
    assert "nri_cni.ttrpc.connection" in {i.target for i in package["nri_cni.ttrpc.client"].imports}
    assert "nri_cni.cli.daemon" in {
        i.target for i in package["nri_cni.cli.main"].imports
    }  # through importlib
    assert "nri_cni.cni.runtime" in {n for i in package["nri_cni.cli.cnitool"].late for n in i.names}


def _layer_entries() -> list[str]:
    """The modules and packages the import contract's layers name, in order."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    return [name.strip() for layer in layers for name in re.split(r"[|:]", layer)]


def test_the_layers_contract_leaves_no_module_out(package):
    """Every module of nri_cni/ is in a layer (the root package's __init__ holds only the version),
    every folder is named by itself, and no layer names a module that is gone."""
    entries = _layer_entries()
    left_out = sorted(
        m for m in package if m != "nri_cni" and not any(m == e or m.startswith(e + ".") for e in entries)
    )
    assert not left_out, f"modules no layer of [tool.importlinter] covers: {left_out}"
    folders = {module_name(p) for p in PACKAGE.glob("*/__init__.py")}
    assert folders - set(entries) == set(), "folders the layers do not name"
    assert [e for e in entries if e not in package] == []


def test_the_package_root_holds_only_init_main_and_errors():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "errors.py"]


MAX_MODULE_LINES = 420  # "about 400": a module past it is split by job


def test_no_module_is_over_about_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if "api" not in p.relative_to(PACKAGE).parts
        and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_readme_layout_names_every_folder():
    readme = (ROOT / "README.md").read_text()
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")) + ["data"]
    missing = [f for f in folders if f"| `nri_cni/{f}/` |" not in readme]
    assert missing == [], "folders of nri_cni/ the README's layout table does not name"


def test_the_architecture_names_every_folder_and_only_files_that_exist():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc[doc.index("## The tree") : doc.index("## Layers")]
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert [f for f in folders if f"  {f}/ " not in tree] == [], (
        "folders docs/architecture.md's tree leaves out"
    )
    named = set(re.findall(r"\b(?:[a-z_]+/)+[a-z_]+\.py\b", doc))
    gone = sorted(n for n in named if not (PACKAGE / n).exists() and not (ROOT / n).exists())
    assert gone == [], "files docs/architecture.md names that do not exist"


def test_no_import_cycle(package):
    found = cycles(_edges(package, KNOWN_CYCLES_UNTIL_APP_MERGE))
    assert not found, "import cycles in nri_cni/:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_known_cycles_still_exist(package):
    """An allowance for a cycle that is gone must go too."""
    edges = _edges(package)
    stale = [sorted(p) for p in KNOWN_CYCLES_UNTIL_APP_MERGE if not _both_ways(edges, *sorted(p))]
    assert not stale, f"remove from KNOWN_CYCLES_UNTIL_APP_MERGE: {stale}"


def _both_ways(edges: dict[str, set[str]], a: str, b: str) -> bool:
    def reaches(src: str, dst: str) -> bool:
        seen: set[str] = set()
        todo = [src]
        while todo:
            v = todo.pop()
            if v == dst:
                return True
            if v not in seen:
                seen.add(v)
                todo.extend(edges.get(v, ()))
        return False

    return reaches(a, b) and reaches(b, a)


def _unjustified(package: dict[str, Module]) -> set[tuple[str, str, int]]:
    return {
        (m, n, i.line) for m, mod in package.items() for i in mod.late if not i.justified for n in i.names
    }


def test_function_level_imports_say_why(package):
    unjustified = sorted(u for u in _unjustified(package) if u[:2] not in KNOWN_LAZY_UNTIL_APP_MERGE)
    assert not unjustified, (
        "imports inside functions without a `# lazy: <reason>` comment (hoist them, or say why):\n  "
        + "\n  ".join(f"{m}:{line} imports {n}" for m, n, line in unjustified)
    )


def test_known_lazy_imports_still_exist(package):
    stale = sorted(KNOWN_LAZY_UNTIL_APP_MERGE - {u[:2] for u in _unjustified(package)})
    assert not stale, f"remove from KNOWN_LAZY_UNTIL_APP_MERGE: {stale}"


def test_lazy_rule_reads_comments():
    """The justification rule on a small module: a comment above a run covers the run; an
    import elsewhere in the function, or a comment without a reason, does not count."""
    source = (
        "def f():\n"
        "    # lazy: heavy,\n"
        "    # and more words\n"
        "    import nri_cni.cni.runtime\n"
        "\n"
        "    from nri_cni import config\n"
        "    x = 1\n"
        "    import nri_cni.errors  # lazy:\n"
        "    return x\n"
    )
    known = {"nri_cni", "nri_cni.cni", "nri_cni.cni.runtime", "nri_cni.config", "nri_cni.errors"}
    mod = read_module("nri_cni._probe_", source, is_package=False, known=known)
    assert [(i.names, i.justified) for i in mod.late] == [
        (("nri_cni.cni.runtime",), True),
        (("nri_cni",), True),
        (("nri_cni.errors",), False),
    ]
    assert {i.target for i in mod.imports} == {
        "nri_cni.cni",
        "nri_cni.cni.runtime",
        "nri_cni.config",
        "nri_cni.errors",
    }


def test_cycle_finder_finds_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
