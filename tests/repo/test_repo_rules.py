"""Rules the repository itself keeps: no package-archive host is written into it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]

# Written escaped, so that this file does not match itself.
KNOWN_HOSTS = [
    r"deb\.debian\.org",
    r"security\.debian\.org",
    r"pypi\.org",
    r"files\.pythonhosted",
    r"registry\.npmjs",
]


def machine_archive_hosts() -> list[str]:
    """The hosts of the archives this machine's apt uses (what .ci/apt-archive-uri reads)."""
    uri = subprocess.run(
        ["bash", str(ROOT / ".ci" / "apt-archive-uri")], capture_output=True, text=True, check=True
    ).stdout.strip()
    host = urlsplit(uri).hostname
    return [re.escape(host)] if host else []


def test_no_package_archive_host_in_the_repository():
    pattern = "|".join(KNOWN_HOSTS + machine_archive_hosts())
    # --no-index: also in a copy of the tree without .git (the unit run as nobody); what
    # .gitignore leaves out (the venv, caches) is not searched
    found = subprocess.run(
        ["git", "grep", "--no-index", "--exclude-standard", "-n", "-I", "-E", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1, f"package-archive host written in the repo:\n{found.stdout}"


def test_archive_uri_is_read_from_the_machine(tmp_path):
    """.ci/apt-archive-uri answers with a URI of this machine's apt configuration."""
    uri = subprocess.run(
        ["bash", str(ROOT / ".ci" / "apt-archive-uri")], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert urlsplit(uri).scheme in {"http", "https", "file"}
    sources = [p.read_text() for p in Path("/etc/apt/sources.list.d").glob("*.sources")]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        sources.append(legacy.read_text())
    assert any(uri in text for text in sources)
