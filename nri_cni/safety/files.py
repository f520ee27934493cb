"""Files and directories nri-cni writes or trusts, as root on a node shared with other users.

Crash-safe small files (the CNI cache entries, the intent records): a reader, or the next start
after a crash, sees the old file or the new one, never a part of one: the data goes to a
temporary file in the same directory, which is renamed over the target; `durable` adds the
fsyncs (file, then directory) that make the result survive a power loss (`AtomicFile`,
`write_atomic`, `fsync_dir`, `is_temporary`). A file made ahead without a name (`Unnamed`)
gets its name, data written, at once: a new name only, never over a file. A file removed on a
pod's path leaves its directory by a rename and is unlinked off the event loop (`remove_soon`).

What nri-cni creates or trusts:
- `restrict_umask()`: the daemon adds 077 to whatever umask it inherited before it creates any
  directory, file or socket, so nothing it makes is ever group- or world-accessible (a unit file
  or a shell with umask 000 used to give 0777 state dirs and a window on the socket).
- `private_dir()`: a directory made 0700 (and a group/other-writable one it finds is fixed).
- `child()`: the path of a state file named from untrusted input; it can never leave its
  directory (no `/`, no NUL, not `.`/`..`, not empty, at most 255 bytes) whatever the input.
- `trust_problem()`: conf dirs, network lists and plugin binaries are read or run as root, so a
  file (or a directory above it) that another user can write, or that another user owns, is
  refused; `files.trust: warn` in the config downgrades that to a warning for development.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import os
import stat

log = logging.getLogger("nri_cni.safefs")  # the name it had: log filters may use it

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_NAME_BYTES = 255


class UnsafePath(ValueError):
    """A file name built from input would leave its directory."""


def restrict_umask() -> int:
    """Adds 077 to the process umask (never loosens it); returns the previous one."""
    old = os.umask(PRIVATE_UMASK)
    os.umask(old | PRIVATE_UMASK)
    return old


def private_dir(path: str) -> str:
    """Creates `path` (and missing parents) as 0700 whatever the umask; a directory that already
    exists and is writable by group or others gets those bits removed."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    st = os.stat(path)
    if st.st_mode & 0o022:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    return path


def child(directory: str, name: str) -> str:
    """os.path.join(directory, name) for a `name` that must be a single path component."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
    ):
        raise UnsafePath(f"{name[:300]!r} is not a safe file name")
    return os.path.join(directory, name)


def trust_problem(path: str, *, executable: bool = False) -> str:
    """Why `path` cannot be trusted by root; "" when it can. Checked: the directory holding the
    name, the file it resolves to (as exec and open follow symlinks) and that file's directory:
    each owned by root (or the daemon's own user) and not writable by group or others. Higher
    directories are the admin's (a world-writable /tmp above a private test dir is fine)."""
    me = os.geteuid()
    path = os.path.abspath(path)
    try:
        # realpath costs ~15 us (an lstat per component): only for a link (once per plugin call)
        real = os.path.realpath(path) if stat.S_ISLNK(os.lstat(path).st_mode) else path
    except OSError as exc:
        return f"{path}: cannot stat: {exc.strerror or exc}"
    for candidate in dict.fromkeys((os.path.dirname(path), real, os.path.dirname(real))):
        try:
            st = os.stat(candidate)
        except OSError as exc:
            return f"{candidate}: cannot stat: {exc.strerror or exc}"
        problem = _owner_mode_problem(candidate, st, me)
        if problem:
            return problem
        if executable and candidate == real and not stat.S_ISREG(st.st_mode):
            return f"{real}: not a regular file"
    return ""


def _owner_mode_problem(path: str, st: os.stat_result, me: int) -> str:
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, me):
        return f"{path} is owned by uid {st.st_uid}, not root (mode {mode:04o})"
    if mode & 0o022:
        return f"{path} is writable by group or others (mode {mode:04o})"
    return ""


def check_trusted(path: str, *, enforce: bool, what: str, executable: bool = False) -> str:
    """trust_problem() as a policy: the problem when enforced, else a logged warning and ""."""
    problem = trust_problem(path, executable=executable)
    if problem and not enforce:
        log.warning("%s %s is trusted anyway (files.trust: warn): %s", what, path, problem)
        return ""
    return problem


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
            _write_all(self.fd, data, durable=durable)
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


def _write_all(fd: int, data: bytes, *, durable: bool) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if durable:
        os.fsync(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400


class Unnamed:
    """An empty file made ahead in `directory` with O_TMPFILE: an inode in no directory, so
    no listing shows it and the kernel frees it when its descriptor closes (a process killed
    before publish() leaves nothing). publish() writes the data and links the file in under
    its name (linkat through /proc/self/fd): the name appears with the whole data, as a
    rename's would, and the inode's creation is not on the caller's path (ext4 beside a
    runtime creating pods: 0.5-1 ms for a file created, 0.1-0.15 for a name linked).
    Raises OSError: where the file system has no O_TMPFILE, and from publish() (then the file
    is gone) when the name exists (a link never replaces a file) or the directory is gone."""

    def __init__(self, directory: str, mode: int = FILE_MODE) -> None:
        self.fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode)

    def publish(self, path: str, data: bytes, *, durable: bool = True) -> None:
        try:
            _write_all(self.fd, data, durable=durable)
            source = f"/proc/self/fd/{self.fd}".encode()
            if _libc.linkat(_AT_FDCWD, source, _AT_FDCWD, os.fsencode(path), _AT_SYMLINK_FOLLOW) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
        finally:
            self.close()
        if durable:
            fsync_dir(os.path.dirname(path))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


_trash_seq = itertools.count()
# how long a removed file waits in the trash for its unlink: one started at once ran beside the
# pod's answer and delayed it by what the rename saved (CRI-O's DEL: the bridge plugin gone ->
# the shim gone 1.36-1.44 ms either way; 1.20-1.21 with the unlink 10 ms later)
UNLINK_AFTER = 0.01  # seconds


def remove_soon(path: str, trash: str) -> bool:
    """Removes `path`; False when there was none. Given a `trash` directory (the daemon's
    stores: their event loop outlives the call) and on a running loop, the file leaves its
    directory at once by a rename into `trash` (on the same file system, made private when
    missing) and is unlinked there on a worker thread UNLINK_AFTER later: an unlink waited for
    the file system (0.3-0.8 ms beside a runtime creating pods, strace -T; a rename 0.02-0.05)
    on the pod's path before its answer. With `trash` "" (a tool: its loop ends with its call,
    and the directory may be libcni's) or no loop it is unlinked in the call, and no trash is
    made. What a kill (or the loop's end) leaves in `trash` is `empty`'s (start-up). Raises
    OSError when the file cannot be removed."""
    loop = _running_loop() if trash else None
    if loop is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    gone = os.path.join(trash, f"{os.path.basename(path)}.{os.getpid()}.{next(_trash_seq)}")
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        if not os.path.lexists(path):
            return False
        private_dir(trash)  # the first removal since it was made (or removed)
        os.rename(path, gone)
    loop.call_later(UNLINK_AFTER, _unlink_off, loop, gone)
    return True


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _unlink_off(loop: asyncio.AbstractEventLoop, path: str) -> None:
    try:
        loop.run_in_executor(None, _unlink_logged, path)
    except RuntimeError:  # the loop is ending (its threads are gone): here, then
        _unlink_logged(path)


def empty(directory: str) -> None:
    """Unlinks every file in `directory` (a missing one is empty): remove_soon()'s trash at
    start-up, where a kill between a rename and its unlink left a file."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        _unlink_logged(os.path.join(directory, name))


def _unlink_logged(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # the file has left its own directory already
        log.warning("cannot remove %s: %s", path, exc.strerror or exc)


def atomic_in(path: str, *dirs: str) -> AtomicFile:
    """AtomicFile(path), its directory made when missing (the first file, or the directory was
    removed): `dirs`, parents first, each private_dir(). Not looked at when it exists: a mkdir
    and two stats less on every write (0.12 ms cold, on a pod's path before its plugins)."""
    try:
        return AtomicFile(path)
    except FileNotFoundError:
        for directory in dirs:
            private_dir(directory)
        return AtomicFile(path)


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
