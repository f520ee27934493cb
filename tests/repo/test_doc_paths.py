"""Docs and comments name only files that exist: every `dir/file.ext` named in docs/*.md,
README.md and the comments and docstrings of nri_cni/ is a file of the repository (named from
the root, from nri_cni/, from the naming file's directory, or by its last parts, as
`pod/attach.py` names nri_cni/pod/attach.py)."""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(
    r"(?<![\w./-])((?:[\w.-]+/)+[\w-]+\.(?:py|md|c|h|sh|toml|yaml|yml|json|txt|conf|conflist|proto))\b"
)
CHECKOUT = "nri-cni/"  # the repository's own directory, as docs/deploy.md clones it
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}


def repo_files() -> set[str]:
    """Every file under the root (the unit run may have no .git: walked, not listed)."""
    out = set()
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        rel = os.path.relpath(top, ROOT)
        out.update(f if rel == "." else f"{rel}/{f}" for f in files)
    return out


def names_in_comments(source: str) -> list[str]:
    """The file names in a Python source's comments and docstrings (not in code strings)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''"))
        ):
            found += NAMED.findall(tok.string)
    return found


def resolves(name: str, named_in: str, files: set[str]) -> bool:
    name = name.removeprefix(CHECKOUT)
    here = os.path.dirname(named_in)
    candidates = {name, f"nri_cni/{name}", os.path.normpath(os.path.join(here, name))}
    return bool(candidates & files) or any(f.endswith("/" + name) for f in files)


def missing_names(files: set[str], texts: dict[str, list[str]]) -> list[str]:
    return sorted(
        f"{where}: {name}"
        for where, names in texts.items()
        for name in names
        if not resolves(name, where, files)
    )


def test_the_check_finds_a_name_of_no_file():
    files = {"nri_cni/pod/attach.py", "docs/lifecycle.md"}
    assert missing_names(files, {"docs/a.md": ["pod/attach.py", "docs/lifecycle.md"]}) == []
    # control: the same text naming a file that is not there
    assert missing_names(files, {"docs/a.md": ["pod/attached.py"]}) == ["docs/a.md: pod/attached.py"]
    assert names_in_comments('x = "a/b.py"  # see c/d.py\n') == ["c/d.py"]


def test_docs_and_comments_name_only_files_that_exist():
    files = repo_files()
    texts = {}
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        texts[str(path.relative_to(ROOT))] = NAMED.findall(path.read_text())
    for path in sorted((ROOT / "nri_cni").rglob("*.py")):
        texts[str(path.relative_to(ROOT))] = names_in_comments(path.read_text())
    assert missing_names(files, texts) == []
