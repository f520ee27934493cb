"""PluginExecutor.find remembers a binary that passed the trust check, by what it saw of the
file and its directory: any change to either (mode, owner, a replaced file) is checked again."""

from __future__ import annotations

import os
import shutil

import pytest

from nri_cni.cni import exec as exec_module
from nri_cni.cni.exec import PluginExecutor
from nri_cni.errors import PluginNotRun


@pytest.fixture
def bin_dir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    exe = d / "nct-plugin"
    exe.write_text("#!/bin/sh\n")
    os.chmod(exe, 0o755)
    return d


@pytest.mark.integration  # chown to another uid: root only
def test_a_change_to_a_trusted_binary_or_its_directory_is_checked_again(bin_dir):
    ex = PluginExecutor()
    path = str(bin_dir / "nct-plugin")
    assert ex.find("nct-plugin", [str(bin_dir)]) == path
    assert ex.find("nct-plugin", [str(bin_dir)]) == path  # remembered
    os.chmod(path, 0o777)
    with pytest.raises(PluginNotRun, match="writable by group or others"):
        ex.find("nct-plugin", [str(bin_dir)])
    os.chmod(path, 0o755)
    assert ex.find("nct-plugin", [str(bin_dir)]) == path
    os.chmod(bin_dir, 0o777)
    try:
        with pytest.raises(PluginNotRun, match="writable by group or others"):
            ex.find("nct-plugin", [str(bin_dir)])
    finally:
        os.chmod(bin_dir, 0o755)
    # replaced by another file (a new inode) that is not trusted
    replacement = bin_dir / "other"
    replacement.write_text("#!/bin/sh\n")
    os.chmod(replacement, 0o755)
    assert ex.find("nct-plugin", [str(bin_dir)]) == path
    os.chown(replacement, 12345, 12345)
    shutil.move(str(replacement), path)
    with pytest.raises(PluginNotRun, match="owned by uid 12345"):
        ex.find("nct-plugin", [str(bin_dir)])


@pytest.fixture
def linked(tmp_path, bin_dir, monkeypatch):
    """A bin dir of links (links/nct-plugin -> bin/nct-plugin), and a count of the full trust
    checks find() makes (files.trust_problem, which walks the link's path)."""
    links = tmp_path / "links"
    links.mkdir(mode=0o755)
    os.chmod(links, 0o755)
    os.symlink(bin_dir / "nct-plugin", links / "nct-plugin")
    checks: list[str] = []
    real_check = exec_module.files.trust_problem

    def counted(path, **kw):
        checks.append(path)
        return real_check(path, **kw)

    monkeypatch.setattr(exec_module.files, "trust_problem", counted)
    return links, checks


@pytest.mark.integration  # chown to another uid: root only
def test_a_linked_binary_that_passed_is_remembered_until_the_link_or_what_it_leads_to_changes(
    tmp_path, bin_dir, linked
):
    links, checks = linked
    ex = PluginExecutor()
    path = str(links / "nct-plugin")

    def find() -> str:
        return ex.find("nct-plugin", [str(links)])

    assert find() == path and len(checks) == 1
    assert find() == path and len(checks) == 1  # remembered: no second walk (the control: below)
    os.chmod(bin_dir / "nct-plugin", 0o777)  # the file it leads to
    with pytest.raises(PluginNotRun, match="writable by group or others"):
        find()
    os.chmod(bin_dir / "nct-plugin", 0o755)
    assert find() == path
    for d in (bin_dir, links):  # the file's directory, the link's
        os.chmod(d, 0o777)
        try:
            with pytest.raises(PluginNotRun, match="writable by group or others"):
                find()
        finally:
            os.chmod(d, 0o755)
        assert find() == path
    # re-pointed to a file another user owns, in a directory of its own
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chmod(other, 0o755)
    (other / "nct-plugin").write_text("#!/bin/sh\n")
    os.chmod(other / "nct-plugin", 0o755)
    os.chown(other / "nct-plugin", 12345, 12345)
    os.unlink(path)
    os.symlink(other / "nct-plugin", path)
    with pytest.raises(PluginNotRun, match="owned by uid 12345"):
        find()
    # back to the trusted file, then that file replaced by another user's (a new inode)
    os.unlink(path)
    os.symlink(bin_dir / "nct-plugin", path)
    assert find() == path
    shutil.move(str(other / "nct-plugin"), str(bin_dir / "nct-plugin"))
    with pytest.raises(PluginNotRun, match="owned by uid 12345"):
        find()
    # the directory the link led to when it passed is gone, the link leads elsewhere now: looked
    # up again, not taken for a plugin that is not there
    os.unlink(path)
    os.symlink(other / "elsewhere", path)
    (other / "elsewhere").write_text("#!/bin/sh\n")
    os.chmod(other / "elsewhere", 0o755)
    assert find() == path
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o755)
    os.chmod(fresh, 0o755)
    shutil.copy(other / "elsewhere", fresh / "nct-plugin")
    os.unlink(path)
    os.symlink(fresh / "nct-plugin", path)
    shutil.rmtree(other)
    assert find() == path
