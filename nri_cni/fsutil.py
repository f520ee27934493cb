"""Crash-safe small files: the CNI cache entries and the intent records.

A reader (or the next start after a crash) sees the old file or the new one, never a part of
one: the data goes to a temporary file in the same directory, which is renamed over the target.
`durable` adds the fsyncs (file, then directory) that make the result survive a power loss.
"""

from __future__ import annotations

import itertools
import os

_tmp_seq = itertools.count()


class AtomicFile:
    """A file written under a temporary name in its directory and renamed over `path` by
    commit(). Creating it early (before the data is known) takes the file creation off the
    path that waits for the data; abort(), or a failed commit(), removes the temporary file.
    Raises OSError when the temporary file cannot be created."""

    def __init__(self, path: str, mode: int = 0o600) -> None:
        self.path = path
        self.directory = os.path.dirname(path)
        self.tmp = os.path.join(
            self.directory, f".{os.path.basename(path)}.{os.getpid()}.{next(_tmp_seq)}.tmp"
        )
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)

    def commit(self, data: bytes, *, durable: bool = True) -> None:
        """Raises OSError (ENOSPC, EIO...) and then leaves no temporary file behind."""
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
            if durable:
                os.fsync(self.fd)
            fd, self.fd = self.fd, -1
            os.close(fd)
            os.rename(self.tmp, self.path)
        except OSError:
            self.abort()
            raise
        if durable:
            fsync_dir(self.directory)

    def abort(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


def write_atomic(path: str, data: bytes, *, durable: bool = True, mode: int = 0o600) -> None:
    """Raises OSError (ENOSPC, EIO...) and then leaves no temporary file behind."""
    AtomicFile(path, mode).commit(data, durable=durable)


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
