"""A file made ahead without a name (files.Unnamed): no listing shows it until publish() gives it
its name with the whole data; a name that exists is never replaced."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import tempfile

import pytest

from nri_cni.safety import files
from tests.support.aio import emptied, on_a_loop


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


@pytest.mark.parametrize("loop", [True, False], ids=["on-the-loop", "control-no-loop"])
def test_remove_soon_renames_at_once_and_unlinks_off_the_loop(tmp_path, monkeypatch, loop):
    """On a loop the file leaves its directory by a rename into the trash (made 0700) and is
    unlinked there by a worker thread; without one (a tool) it is unlinked in the call and no
    trash is made. A missing file is False either way."""
    (tmp_path / "dir").mkdir()
    path, trash = tmp_path / "dir" / "entry", tmp_path / "trash"
    path.write_text("x")
    unlinked: list[tuple[str, bool]] = []
    real = files._unlink_logged
    monkeypatch.setattr(
        files, "_unlink_logged", lambda p: unlinked.append((os.path.dirname(p), on_a_loop())) or real(p)
    )

    async def remove() -> tuple[bool, list[str], bool]:
        removed = files.remove_soon(str(path), str(trash))
        left = os.listdir(tmp_path / "dir")
        assert len(os.listdir(trash)) == 1 and unlinked == []  # unlinked UNLINK_AFTER later
        await asyncio.wait_for(emptied(trash), 60)
        return removed, left, files.remove_soon(str(path), str(trash))

    if loop:
        removed, left, again = asyncio.run(remove())
        assert unlinked == [(str(trash), False)] and os.listdir(trash) == []
        assert trash.stat().st_mode & 0o777 == 0o700
    else:
        removed, again = files.remove_soon(str(path), str(trash)), files.remove_soon(str(path), str(trash))
        left = os.listdir(tmp_path / "dir")
        assert unlinked == [] and not trash.exists()
    assert (removed, left, again) == (True, [], False)


def test_remove_soon_raises_what_keeps_the_file(tmp_path):
    """A file on another file system cannot be renamed into the trash (on a loop), a directory
    cannot be unlinked (without one): the error is raised and the file stays."""
    shm = tempfile.mkdtemp(dir="/dev/shm")
    try:
        other = os.path.join(shm, "entry")
        with open(other, "w") as f:
            f.write("x")

        async def remove() -> None:
            files.remove_soon(other, str(tmp_path / "trash"))

        with pytest.raises(OSError) as err:
            asyncio.run(remove())
        assert err.value.errno == errno.EXDEV and os.path.exists(other)
    finally:
        shutil.rmtree(shm)
    (tmp_path / "adir").mkdir()
    with pytest.raises(OSError):
        files.remove_soon(str(tmp_path / "adir"), str(tmp_path / "trash"))
    assert (tmp_path / "adir").is_dir()


def test_empty_unlinks_what_a_kill_left_in_the_trash(tmp_path):
    files.empty(str(tmp_path / "missing"))  # none: nothing to do
    (tmp_path / "trash").mkdir()
    for name in ("a.1.0", "b.2.7"):
        (tmp_path / "trash" / name).write_text("x")
    files.empty(str(tmp_path / "trash"))
    assert os.listdir(tmp_path / "trash") == []


def test_a_removal_due_as_the_loop_ends_is_done_in_its_timer(tmp_path):
    """The loop's threads are gone (asyncio.run ends it): the file is unlinked in the call.
    Control (the test above): with the threads there, a worker unlinks it."""
    (tmp_path / "gone.1.0").write_text("x")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.shutdown_default_executor()
        files._unlink_off(loop, str(tmp_path / "gone.1.0"))

    asyncio.run(main())
    assert os.listdir(tmp_path) == []
