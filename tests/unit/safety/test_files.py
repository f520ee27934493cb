"""A file made ahead without a name (files.Unnamed): no listing shows it until publish() gives it
its name with the whole data; a name that exists is never replaced."""

from __future__ import annotations

import errno
import os

import pytest

from nri_cni.safety import files


def test_a_file_made_ahead_shows_nowhere_until_published_with_its_data(tmp_path):
    ahead = files.Unnamed(str(tmp_path))
    assert os.listdir(tmp_path) == []  # a kill now leaves nothing: the inode has no name
    ahead.publish(str(tmp_path / "rec"), b'{"a":1}', durable=False)
    assert os.listdir(tmp_path) == ["rec"] and (tmp_path / "rec").read_bytes() == b'{"a":1}'
    assert (tmp_path / "rec").stat().st_mode & 0o777 == 0o600
    assert ahead.fd == -1  # its descriptor is let go


def test_a_name_that_exists_is_not_replaced_and_the_file_is_let_go(tmp_path):
    """Control: the same data published under a new name is there."""
    (tmp_path / "rec").write_bytes(b"old")
    ahead = files.Unnamed(str(tmp_path))
    fd = ahead.fd
    with pytest.raises(OSError) as err:
        ahead.publish(str(tmp_path / "rec"), b"new", durable=False)
    assert err.value.errno == errno.EEXIST and err.value.filename == str(tmp_path / "rec")
    assert (tmp_path / "rec").read_bytes() == b"old" and os.listdir(tmp_path) == ["rec"]
    assert ahead.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    files.Unnamed(str(tmp_path)).publish(str(tmp_path / "other"), b"new", durable=False)
    assert (tmp_path / "other").read_bytes() == b"new"


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "control-not-durable"])
def test_durable_fsyncs_the_file_then_its_directory(tmp_path, fsynced, durable):
    directory = tmp_path / "d"
    directory.mkdir()
    files.Unnamed(str(directory)).publish(str(directory / "rec"), b"x", durable=durable)
    if durable:
        # the file is synced before it has a name: /proc shows the unnamed inode as "(deleted)"
        assert len(fsynced) == 2 and fsynced[1] == str(directory)
        assert fsynced[0].startswith(f"{directory}/#") and fsynced[0].endswith("(deleted)")
    else:
        assert fsynced == []


def test_a_directory_gone_meanwhile_fails_the_publish(tmp_path):
    (tmp_path / "d").mkdir()
    ahead = files.Unnamed(str(tmp_path / "d"))
    with pytest.raises(OSError) as err:
        ahead.publish(str(tmp_path / "e" / "rec"), b"x", durable=False)
    assert err.value.errno == errno.ENOENT and ahead.fd == -1


def test_close_lets_the_file_go_once(tmp_path):
    ahead = files.Unnamed(str(tmp_path))
    ahead.close()
    ahead.close()
    assert ahead.fd == -1 and os.listdir(tmp_path) == []
