"""The directory watcher runs on asyncinotify (a maintained library, not nri-cni's
own ctypes binding), and closing it gives its file descriptor back."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncinotify

from nri_cni.daemon import inotify
from nri_cni.daemon.inotify import DirWatcher


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_watcher_is_asyncinotify_and_gives_its_fd_back(tmp_path):
    source = Path(inotify.__file__).read_text()
    assert "import ctypes" not in source

    async def scenario():
        before = open_fds()
        changed = asyncio.Event()
        watcher = DirWatcher(changed.set)
        assert isinstance(watcher._inotify, asyncinotify.Inotify)
        assert watcher.watch([str(tmp_path)]) == {str(tmp_path)}
        (tmp_path / "x.yaml").write_text("a: 1\n")
        await asyncio.wait_for(changed.wait(), 60)
        watcher.close()
        await asyncio.sleep(0)  # the cancelled reader task ends
        assert open_fds() <= before

    asyncio.run(scenario())


def _names_until(tmp_path: Path, mask, sentinel: str, act) -> list[str]:
    """The names of the events `mask` reports in tmp_path while act() runs, up to `sentinel`'s."""

    async def scenario():
        with asyncinotify.Inotify() as ino:
            ino.add_watch(tmp_path, mask)
            act()
            names = []
            async for event in ino:
                names.append(event.name.name if event.name else "")
                if names[-1] == sentinel:
                    return names

    return asyncio.run(scenario())


def test_appending_to_an_open_file_is_no_change_but_a_closed_write_is(tmp_path):
    """A log kept open in a watched directory (nri-cni's own beside its config) must not wake
    the daemon, nor re-read the configuration, on every line; a config file written and closed
    (then the sentinel, moved in) is seen. Control: with MODIFY in the mask, the log's line is."""
    log = (tmp_path / "nri-cni.log").open("a")
    outside = tmp_path.parent / f"{tmp_path.name}-sentinel"

    def act():
        log.write("a line\n")
        log.flush()
        (tmp_path / "config.yaml").write_text("mode: shim\n")
        outside.write_text("")
        os.rename(outside, tmp_path / "sentinel")

    try:
        seen = _names_until(tmp_path, inotify.DIR_EVENTS, "sentinel", act)
        assert "nri-cni.log" not in seen, seen
        assert "config.yaml" in seen, seen
        control = _names_until(tmp_path, inotify.DIR_EVENTS | asyncinotify.Mask.MODIFY, "sentinel", act)
        assert "nri-cni.log" in control, control
    finally:
        log.close()
