"""Directory watches with Linux inotify, through asyncinotify (a maintained, asyncio-native
binding) instead of nri-cni's own ctypes code.

Only "something changed in one of these directories" is reported: the reloader re-reads
everything anyway, so event details (which file, which kind) would be noise. Directories, not
files, are watched: editors and ConfigMap updates replace files by rename, and a watch on the
old inode would go quiet.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Iterable

from asyncinotify import Inotify, Mask, Watch

log = logging.getLogger("nri_cni.reload")

# No MODIFY: a file written and closed says so with CLOSE_WRITE (an edit is read once it is
# complete), while every write to a file kept open in a watched directory (nri-cni's own log
# beside its config, a log in the CNI conf dir) woke the daemon and, after the debounce, re-read
# the whole configuration: ~4 times a second beside the pods' plugins in bench_crio's daemon.
DIR_EVENTS = (
    Mask.ATTRIB
    | Mask.CLOSE_WRITE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.CREATE
    | Mask.DELETE
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)


class InotifyUnavailable(OSError):
    """No inotify here (not Linux, or the instance limit is reached)."""


class DirWatcher:
    """Watches a set of directories; calls `on_change()` from the loop after any event."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        try:
            self._inotify = Inotify()
        except OSError as exc:
            raise InotifyUnavailable(
                exc.errno or errno.ENOSYS, f"inotify_init1: {exc.strerror or exc}"
            ) from exc
        self._on_change = on_change
        self._watches: dict[str, Watch] = {}  # path -> its watch
        self._task: asyncio.Task | None = asyncio.get_running_loop().create_task(
            self._events(), name="inotify"
        )

    @property
    def watched(self) -> set[str]:
        return set(self._watches)

    def watch(self, paths: Iterable[str]) -> set[str]:
        """Makes the watched set exactly `paths` (those that exist and are directories);
        returns the paths watched now that were not before."""
        added: set[str] = set()
        wanted = {os.path.abspath(p) for p in paths}
        for path in set(self._watches) - wanted:
            try:
                self._inotify.rm_watch(self._watches.pop(path))
            except OSError:
                pass  # EINVAL: the directory (and its watch) is gone already
        for path in sorted(wanted - set(self._watches)):
            try:
                self._watches[path] = self._inotify.add_watch(path, DIR_EVENTS)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # missing: the rescan covers it
                    log.warning(
                        "cannot watch %s: %s (the periodic rescan still sees changes)",
                        path,
                        exc.strerror or exc,
                    )
                continue
            added.add(path)
        return added

    async def _events(self) -> None:
        try:
            async for event in self._inotify:
                if Mask.IGNORED in event.mask:  # the directory went away: its watch is gone
                    for path, known in list(self._watches.items()):
                        if event.watch is known:
                            del self._watches[path]
                self._on_change()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the fd broke: the periodic rescan is what is left
            log.error("reading inotify events failed: %s", exc)

    def close(self) -> None:
        if self._task is not None:
            # the reader goes before the fd closes: the cancelled task would remove it later,
            # by number, when that number may already be another file's
            asyncio.get_running_loop().remove_reader(self._inotify.fd)
            self._task.cancel()
            self._task = None
            self._inotify.close()
            self._watches.clear()
