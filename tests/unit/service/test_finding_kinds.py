"""Every finding verify can give, and every broken code, is listed once in the catalogue
(`nri-cni verify --kinds`) and in docs/reliability.md, with how soon it is noticed, what repair
does and what an admin does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from nri_cni.cli.findings import BROKEN_CODES, FINDINGS
from nri_cni.node import FindingKind
from nri_cni.service import podcheck
from nri_cni.service.podstate import BrokenCode

ROOT = Path(__file__).resolve().parents[3]
# what verify writes into an attachment's verdict besides a FindingKind (app/podcheck.py, verify.py)
VERDICT_WORDS = {
    "check-failed",
    "missing",
    podcheck.NO_RESULT,
    podcheck.BAD_RESULT,
    BrokenCode.NETNS_UNREADABLE.value,
}


def test_the_catalogue_lists_every_finding_and_code_once_with_all_four_answers():
    kinds = [f.kind for f in FINDINGS]
    codes = [f.kind for f in BROKEN_CODES]
    assert len(kinds) == len(set(kinds)) and len(codes) == len(set(codes))
    assert set(kinds) == {k.value for k in FindingKind} | VERDICT_WORDS
    assert set(codes) == {c.value for c in BrokenCode}
    for f in (*FINDINGS, *BROKEN_CODES):
        assert all((f.what, f.noticed, f.repair, f.admin)), f


def test_reliability_md_has_a_row_for_each():
    text = (ROOT / "docs" / "reliability.md").read_text()
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", text, re.M))
    assert {f.kind for f in (*FINDINGS, *BROKEN_CODES)} <= rows


def test_verify_kinds_prints_them_without_a_daemon():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nri_cni.cli",
            "verify",
            "--kinds",
            "--socket",
            "/nonexistent/ncver.sock",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    listed = [line.split(" | ", 1)[0] for line in out.splitlines()]
    for f in (*FINDINGS, *BROKEN_CODES):
        assert f.kind in listed
