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
