"""Generation records on disk: written through fsutil's atomic write, read back, and what a
crash or a failed write leaves."""

from __future__ import annotations

import errno
import os

import pytest

from nri_cni.errors import CniCode, NriCniError
from nri_cni.lifecycle import GenerationRecord, RecordStore
from nri_cni.safety import files as fsutil


def _record(phase: str = "init") -> GenerationRecord:
    return GenerationRecord(network="net1", generation="g1", config=b'{"cniVersion":"1.1.0"}', phase=phase)


def test_a_record_reads_back_as_written(tmp_path):
    store = RecordStore(str(tmp_path))
    store.write(_record("init"))
    store.write(_record("ready"))  # replaces the file
    (rec,) = store.load_all()
    assert (rec.network, rec.generation, rec.phase, rec.config) == (
        "net1",
        "g1",
        "ready",
        b'{"cniVersion":"1.1.0"}',
    )
    assert os.listdir(tmp_path / "networks" / "net1") == ["g1.json"]


def test_a_write_cut_by_a_crash_leaves_the_old_record(tmp_path):
    store = RecordStore(str(tmp_path))
    store.write(_record("ready"))
    netdir = tmp_path / "networks" / "net1"
    # what fsutil.AtomicFile leaves when the process dies before its rename
    fsutil.AtomicFile(str(netdir / "g1.json"))
    assert any(fsutil.is_temporary(n) for n in os.listdir(netdir))
    (rec,) = store.load_all()
    assert rec.phase == "ready"
    assert os.listdir(netdir) == ["g1.json"]  # the leftover is removed


def test_a_failed_write_is_an_io_error_and_leaves_nothing(tmp_path, monkeypatch):
    store = RecordStore(str(tmp_path))

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsutil.os, "rename", no_space)
    with pytest.raises(NriCniError) as caught:
        store.write(_record())
    assert caught.value.cni_code == CniCode.IO_FAILURE
    assert "No space left" in str(caught.value)
    assert os.listdir(tmp_path / "networks" / "net1") == []
