"""Directory watches with Linux inotify, through libc (ctypes): no dependency, no thread.

Only "something changed in one of these directories" is reported: the reloader re-reads
everything anyway, so event details (which file, which kind) would be noise. Directories, not
files, are watched: editors and ConfigMap updates replace files by rename, and a watch on the
old inode would go quiet.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Callable, Iterable

log = logging.getLogger("nri_cni.reload")

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
DIR_EVENTS = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_EVENT = struct.Struct("=iIII")  # struct inotify_event: int wd; u32 mask, cookie, len; name[len]
_EVENT_HEADER = _EVENT.size


class InotifyUnavailable(OSError):
    """No inotify here (not Linux, no libc symbol, or the instance limit is reached)."""


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
        if not hasattr(libc, name):
            raise InotifyUnavailable(errno.ENOSYS, f"libc has no {name}")
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


class DirWatcher:
    """Watches a set of directories; calls `on_change()` from the loop after any event."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyUnavailable(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd
        self._on_change = on_change
        self._wds: dict[str, int] = {}  # path -> watch descriptor
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._readable)

    @property
    def watched(self) -> set[str]:
        return set(self._wds)

    def watch(self, paths: Iterable[str]) -> set[str]:
        """Makes the watched set exactly `paths` (those that exist and are directories);
        returns the paths watched now that were not before."""
        added: set[str] = set()
        wanted = {os.path.abspath(p) for p in paths}
        for path in set(self._wds) - wanted:
            self._libc.inotify_rm_watch(self.fd, self._wds.pop(path))  # EINVAL if already gone
        for path in sorted(wanted - set(self._wds)):
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), DIR_EVENTS)
            if wd < 0:
                err = ctypes.get_errno()
                if err not in (errno.ENOENT, errno.ENOTDIR):  # missing: the rescan covers it
                    log.warning(
                        "cannot watch %s: %s (the periodic rescan still sees changes)", path, os.strerror(err)
                    )
                continue
            self._wds[path] = wd
            added.add(path)
        return added

    def _readable(self) -> None:
        changed = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                break
            except OSError as exc:
                log.error("reading inotify events failed: %s", exc)
                break
            if not data:
                break
            pos = 0
            while pos + _EVENT_HEADER <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                pos += _EVENT_HEADER + length
                if mask & IN_IGNORED:  # the directory went away: its watch is gone
                    for path, known in list(self._wds.items()):
                        if known == wd:
                            del self._wds[path]
                changed = True
        if changed:
            self._on_change()

    def close(self) -> None:
        if self.fd >= 0:
            self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
            self._wds.clear()
