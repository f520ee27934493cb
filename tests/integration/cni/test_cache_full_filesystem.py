"""The result cache on a full filesystem (a 64 KiB tmpfs the test mounts): a write fails with
CNI's I/O error naming the file, leaves no temp file behind and the old entry byte for byte
intact, durable or not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.errors import CniCode, CNIError
from tests.support.golden_cache import GOLDEN, golden_entry


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "nct-tiny", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.netns
def test_full_filesystem_fails_cleanly(tiny_tmpfs):
    cache = ResultCache(str(tiny_tmpfs))
    old = golden_entry()
    cache.write(old)
    path = Path(cache.path("nct-golden", "c0ffee", "eth0"))
    # fill the filesystem to the last byte
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
    new = golden_entry()
    new.capability_args = {"big": "x" * 20000}
    with pytest.raises(CNIError) as err:
        cache.write(new)
    assert err.value.code == CniCode.IO_FAILURE
    assert str(path) in str(err.value)
    assert os.listdir(path.parent) == [path.name]  # no temp file
    assert path.read_bytes() == GOLDEN  # the old entry is intact
    fresh = CacheEntry(container_id="c2", ifname="eth0", network_name="n", config=b"x" * 20000)
    for durable in (True, False):
        with pytest.raises(CNIError) as err:
            cache.write(fresh, durable=durable)
        assert err.value.code == CniCode.IO_FAILURE
        assert os.listdir(path.parent) == [path.name]
