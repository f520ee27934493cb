"""PluginExecutor.find remembers a binary that passed the trust check, by what it saw of the
file and its directory: any change to either (mode, owner, a replaced file) is checked again."""

from __future__ import annotations

import os
import shutil

import pytest

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
