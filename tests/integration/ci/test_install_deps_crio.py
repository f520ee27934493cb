""".ci/install-deps and CRI-O: the three binaries from $NRI_CNI_CRIO_DIR, unpacked into the deps
prefix only when their checksums match SHA256SUMS; a folder without SHA256SUMS named on purpose
is an error, and so is none at the default place, unless NRI_CNI_NO_CRIO=1 leaves the CRI-O
tests out on purpose."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEPS = Path(os.environ.get("NRI_CNI_DEPS", "/opt/nri-cni-deps"))

# runs the system's apt-get only when a package is missing: a machine with the deps installed
pytestmark = pytest.mark.integration

BINARIES = {"crio": b"#!/bin/sh\necho 'crio version 9.9.9'\n", "pinns": b"pinns\n", "copyimg": b"copyimg\n"}


def crio_dir(tmp_path: Path, *, corrupt: str = "") -> Path:
    d = tmp_path / "shared-crio"
    (d / "bin").mkdir(parents=True)
    sums = []
    for name, data in BINARIES.items():
        (d / "bin" / f"{name}.gz").write_bytes(gzip.compress(data + (b"x" if name == corrupt else b"")))
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (d / "SHA256SUMS").write_text("".join(sums))
    return d


def link_installed(prefix: Path) -> None:
    """The sid parts and libcni's driver as they are installed: only CRI-O is new here."""
    (prefix / "root").symlink_to(DEPS / "root")
    (prefix / "bench-go").symlink_to(DEPS / "bench-go")
    (prefix / "versions.txt").write_text((DEPS / "versions.txt").read_text())


def install_deps(tmp_path: Path, crio: Path | None) -> subprocess.CompletedProcess[str]:
    prefix = tmp_path / "deps"
    prefix.mkdir(exist_ok=True)
    if not (prefix / "root").exists():  # the sid parts as they are: only CRI-O is new here
        link_installed(prefix)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NRI_CNI_DEPS": str(prefix)}
    if crio is not None:
        env["NRI_CNI_CRIO_DIR"] = str(crio)
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "install-deps")], env=env, capture_output=True, text=True, timeout=120
    )


def test_crio_is_unpacked_with_matching_checksums(tmp_path):
    out = install_deps(tmp_path, crio_dir(tmp_path))
    assert out.returncode == 0, out.stderr
    for name, data in BINARIES.items():
        path = tmp_path / "deps" / "crio" / "bin" / name
        assert path.read_bytes() == data and os.access(path, os.X_OK)
    assert "  crio 9.9.9 (" in out.stdout
    again = install_deps(tmp_path, crio_dir(tmp_path / "again"))  # in place: nothing to do
    assert again.returncode == 0 and "  crio 9.9.9 (" in again.stdout


def test_a_checksum_mismatch_installs_nothing(tmp_path):
    out = install_deps(tmp_path, crio_dir(tmp_path, corrupt="pinns"))
    assert out.returncode == 1
    assert "checksum mismatch" in out.stderr
    assert not (tmp_path / "deps" / "crio").exists()
    assert not list((tmp_path / "deps").glob(".crio-*"))


def test_a_named_folder_without_checksums_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = install_deps(tmp_path, empty)
    assert out.returncode == 1 and "has no SHA256SUMS" in out.stderr


@pytest.mark.parametrize("opt_out", [False, True])
def test_no_crio_at_the_default_place_fails_unless_left_out_on_purpose(tmp_path, opt_out):
    """A checkout whose ../shared/crio does not exist: a failure that says what to do; with
    NRI_CNI_NO_CRIO=1 (the control case) no failure, and one line saying the tests are left out."""
    ci = tmp_path / "repo" / ".ci"
    ci.mkdir(parents=True)
    for name in ("install-deps", "apt-archive-uri"):
        (ci / name).write_text((ROOT / ".ci" / name).read_text())
    bench = tmp_path / "repo" / "bench"  # libcni's driver: found installed, by its source's hash
    bench.mkdir()
    shutil.copy(ROOT / "bench" / "go-toolchain.sh", bench)
    shutil.copytree(ROOT / "bench" / "libcni-driver", bench / "libcni-driver")
    prefix = tmp_path / "deps"
    prefix.mkdir()
    link_installed(prefix)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NRI_CNI_DEPS": str(prefix)}
    if opt_out:
        env["NRI_CNI_NO_CRIO"] = "1"
    out = subprocess.run(
        ["bash", str(ci / "install-deps")], env=env, capture_output=True, text=True, timeout=120
    )
    if not opt_out:
        assert out.returncode == 1, out.stdout
        assert out.stderr.strip().splitlines()[-1] == (
            f"install-deps: no CRI-O: {tmp_path / 'repo'}/../shared/crio has no SHA256SUMS "
            "(set NRI_CNI_CRIO_DIR, or NRI_CNI_NO_CRIO=1 to leave the CRI-O tests out)"
        )
        return
    assert out.returncode == 0, out.stderr
    assert [ln for ln in out.stdout.splitlines() if ln.startswith("  crio")] == [
        "  crio: none (NRI_CNI_NO_CRIO=1): the CRI-O tests are left out"
    ]
