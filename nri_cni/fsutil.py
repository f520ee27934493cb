"""Crash-safe small files: the CNI cache entries and the intent records.

A reader (or the next start after a crash) sees the old file or the new one, never a part of
one: the data goes to a temporary file in the same directory, which is renamed over the target.
`durable` adds the fsyncs (file, then directory) that make the result survive a power loss.
"""
from __future__ import annotations

import itertools
import os

_tmp_seq = itertools.count()


def write_atomic(path: str, data: bytes, *, durable: bool = True, mode: int = 0o600) -> None:
    """Raises OSError (ENOSPC, EIO...) and then leaves no temporary file behind."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{next(_tmp_seq)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        if durable:
            fsync_dir(directory)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def fsync_dir(directory: str) -> None:
    """Makes renames and unlinks in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """A temporary file write_atomic() left behind when the process died mid-write."""
    return name.startswith(".") and name.endswith(".tmp")
