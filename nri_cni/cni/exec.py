"""Running one CNI plugin binary: libcni's pkg/invoke, built for a low per-call cost.

asyncio's subprocess support starts a watcher thread per child on Python 3.11 and wraps every
pipe in a transport; a CNI call needs none of that, and on a busy node every bit of the
daemon's CPU is taken from the plugins it runs. So a plugin gets memory files (memfd), not
pipes: stdin holds the config (a plugin reads it to EOF as from a pipe), stdout and stderr are
written by the plugin and read once it has exited. The event loop watches one fd per plugin,
a pidfd, and wakes once, at the exit. The plugin is started with os.posix_spawn (glibc's
clone(CLONE_VFORK) path) in its own process group; a timeout kills the whole group.

Bounds: stdout and stderr are sealed at a fixed size (MAX_STDOUT plus a margin, STDERR_MAX),
so a plugin cannot make the daemon hold more. Output past MAX_STDOUT is an error; a single
write that would cross the seal fails in the plugin (EPERM), which then reports that itself.
The exit, not EOF, ends a call: a helper the plugin left running with our stdout cannot hold
the call open, as it does with pipes (and in libcni).
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import signal
import stat
from collections.abc import Iterable
from typing import NoReturn

from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginRef, PluginTimeout

log = logging.getLogger(__name__)

MAX_STDOUT = 16 << 20  # a result is a few KiB; more is a broken or hostile plugin
STDOUT_MARGIN = 64 << 10  # writes up to this far past MAX_STDOUT succeed, so that we see them
STDERR_MAX = 4 << 20  # kept of a plugin's stderr (later writes fail; pages only for what is written)
STDERR_TAIL = 8 << 10  # shown in messages
KILL_GRACE = 2.0  # after SIGKILL, how long to wait for the exit before giving up on it
ETXTBSY_RETRIES = 5  # libcni retries "text file busy" 5 times (1 s apart; we back off faster)

_RESTORE_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)  # Python ignores these; plugins must not


class PluginOutput(bytes):
    """A plugin's stdout, with the tail of its stderr for messages about bad output."""

    stderr: bytes = b""


class PluginExecutor:
    """Finds and runs plugin binaries. Stateless; one instance serves many calls at once."""

    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        """The first regular file named `plugin_type` in `bin_dirs`."""
        if not plugin_type or "/" in plugin_type or "\0" in plugin_type or plugin_type in (".", ".."):
            raise PluginExecError(f"invalid plugin name {plugin_type!r}", ref=PluginRef(plugin=plugin_type))
        dirs = list(bin_dirs)
        for d in dirs:
            path = os.path.join(d, plugin_type)
            try:
                if stat.S_ISREG(os.stat(path).st_mode):
                    return path
            except OSError:
                continue
        raise PluginExecError(f"failed to find plugin {plugin_type!r} in path {dirs}",
                              ref=PluginRef(plugin=plugin_type))

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        """Runs the plugin; returns its stdout on exit 0 (possibly empty).

        Raises CNIError when it printed a CNI error object and failed, PluginTimeout when it
        was killed at `timeout`, PluginExecError for anything else (cannot start, crash,
        garbage, output over MAX_STDOUT).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        run = _Run(loop, stdin)
        try:
            for attempt in range(ETXTBSY_RETRIES + 1):
                try:
                    run.spawn(plugin_path, env)
                    break
                except OSError as exc:
                    # a plugin binary being replaced right now; libcni retries the same way
                    if exc.errno != errno.ETXTBSY or attempt == ETXTBSY_RETRIES:
                        raise PluginExecError(f"cannot run plugin {plugin_path}: {exc.strerror}",
                                              ref=_ref(plugin_path, env)) from None
                    await asyncio.sleep(min(0.05 * 2 ** attempt, max(0.0, deadline - loop.time())))
                    if loop.time() >= deadline:
                        raise PluginTimeout(f"plugin {plugin_path} stayed busy (ETXTBSY) for {timeout}s",
                                            ref=_ref(plugin_path, env)) from None
                except ValueError as exc:  # NUL in an env value or argument
                    raise PluginExecError(f"cannot run plugin {plugin_path}: {exc}",
                                          ref=_ref(plugin_path, env)) from None
            timer = loop.call_at(deadline, run.on_timeout)
            try:
                await run.done
            finally:
                timer.cancel()
        except BaseException:
            run.abandon()
            raise
        if run.status == 0 and not (run.timed_out or run.overflow):
            if run.stderr:
                log.debug("plugin %s %s stderr: %s", plugin_path, env.get("CNI_COMMAND"),
                          run.stderr.decode(errors="replace"))
            out = PluginOutput(run.stdout)
            out.stderr = run.stderr
            return out
        return _failure(run, plugin_path, _ref(plugin_path, env), timeout)


def _ref(plugin_path: str, env: dict[str, str]) -> PluginRef:
    return PluginRef(plugin=os.path.basename(plugin_path), command=env.get("CNI_COMMAND", ""))


class _Run:
    """One child: its memory files, its exit, and the callback that collects them.

    Written lean (it runs twice per plugin chain per pod): the pidfd turns readable when
    the plugin has exited and is a zombie, so the output is read and the child reaped in
    that one callback. Until it is reaped its process group ID cannot be reused, so a
    killpg() at the timeout can never hit an unrelated group.
    """

    __slots__ = ("loop", "stdin", "pid", "pidfd", "fds", "stdout", "stderr", "status", "reaped",
                 "abandoned", "timed_out", "overflow", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, stdin: bytes) -> None:
        self.loop = loop
        self.stdin = stdin
        self.pid = 0
        self.pidfd = -1
        self.fds: list[int] = []  # stdin, stdout, stderr memfds (stdin closed once spawned)
        self.stdout = b""
        self.stderr = b""
        self.status: int | None = None  # exit code, or -signal
        self.reaped = False
        self.abandoned = False
        self.timed_out = False
        self.overflow = False
        self.done = loop.create_future()

    def spawn(self, path: str, env: dict[str, str]) -> None:
        fds = self.fds or self._files()
        self.pid = os.posix_spawn(
            path, [path], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_DUP2, fds[1], 1),
                          (os.POSIX_SPAWN_DUP2, fds[2], 2)],
            setpgroup=0, setsigdef=_RESTORE_SIGNALS, setsigmask=())
        os.close(fds[0])
        fds[0] = -1
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:  # out of fds: poll instead
            self.loop.call_later(0.005, self._poll_exit)
        else:
            self.loop.add_reader(self.pidfd, self._on_exit)

    def _files(self) -> list[int]:
        fds = self.fds
        try:
            fd = os.memfd_create("cni-stdin", os.MFD_CLOEXEC)
            fds.append(fd if fd > 2 else _above_stdio(fd))
            view = memoryview(self.stdin)
            while view:
                view = view[os.write(fd, view):]
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append(_memfd("cni-stdout", MAX_STDOUT + STDOUT_MARGIN))
            fds.append(_memfd("cni-stderr", STDERR_MAX))
        except OSError:
            self._close_files()
            raise
        return fds

    def _on_exit(self) -> None:
        """The pidfd is readable: the plugin has exited."""
        self.loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = -1
        if self.abandoned:
            self._reap(0)
            return
        if not self.done.done():
            self._collect()
            self._reap(0)
            self.done.set_result(None)

    def _poll_exit(self) -> None:
        """The fallback without a pidfd."""
        if self.reaped:
            return
        if not self.abandoned and not self.done.done():
            self._collect_if_exited()
        elif not self._reap(os.WNOHANG):
            self.loop.call_later(0.005, self._poll_exit)

    def _collect_if_exited(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # reaped by someone else
        if info is None:
            self.loop.call_later(0.005, self._poll_exit)
            return
        self._collect()
        self._reap(0)
        self.done.set_result(None)

    def _collect(self) -> None:
        """Reads what the plugin wrote: the files' offsets, shared with the plugin's fds 1
        and 2, say how much."""
        _, out, err = self.fds
        self.fds = []
        try:
            n = os.lseek(out, 0, os.SEEK_CUR)
            if n > MAX_STDOUT:
                self.overflow = True
            elif n:
                self.stdout = _pread_all(out, n, 0)
            n = os.lseek(err, 0, os.SEEK_CUR)
            if n:
                start = max(0, n - STDERR_TAIL)
                self.stderr = _pread_all(err, n - start, start)
        finally:
            os.close(out)
            os.close(err)

    def _reap(self, flags: int) -> bool:
        """waitpid; records the status. False if WNOHANG found it still running."""
        if self.reaped:
            return True
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped by someone else: the status is lost
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return False
        self.reaped = True
        if self.status is None:
            self.status = os.waitstatus_to_exitcode(status)
        return True

    def kill(self) -> None:
        """SIGKILL to the plugin's whole process group."""
        if self.pid and not self.reaped:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def on_timeout(self) -> None:
        if self.done.done():  # finished in the same loop iteration
            return
        self.timed_out = True
        self.kill()
        # the exit follows at once, unless the plugin is stuck in the kernel
        self.loop.call_later(KILL_GRACE, self._give_up)

    def _give_up(self) -> None:
        if not self.done.done():
            self.abandon()
            self.done.set_result(None)

    def abandon(self) -> None:
        """Stops collecting (cancelled, failed, or given up): kill, close the files, and keep
        watching the child's exit so that it is still reaped whenever it dies."""
        self.kill()
        self.abandoned = True
        self._close_files()
        if self.pid and not self.reaped and self._reap(os.WNOHANG) and self.pidfd >= 0:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        # else: the pidfd (or the poll) reaps it once the SIGKILL has landed

    def _close_files(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def _memfd(name: str, cap: int) -> int:
    """An anonymous memory file; with `cap`, sealed at that size (sparse: only what is
    written takes memory)."""
    if not cap:
        return _above_stdio(os.memfd_create(name, os.MFD_CLOEXEC))
    fd = _above_stdio(os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
    try:
        os.ftruncate(fd, cap)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except OSError:
        os.close(fd)
        raise
    return fd


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _above_stdio(fd: int) -> int:
    """Moves an fd off 0-2 (possible if the daemon runs with stdio closed): a dup2 onto
    itself in the child would keep O_CLOEXEC and the plugin would lose that stream."""
    if fd >= 3:
        return fd
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return new


def _failure(run: _Run, plugin_path: str, ref: PluginRef, timeout: float) -> NoReturn:
    stdout = run.stdout
    stderr = run.stderr
    name = os.path.basename(plugin_path)
    if run.timed_out:
        raise PluginTimeout(f"plugin {name} killed after {timeout:g}s timeout",
                            details=excerpt(stdout, stderr), ref=ref)
    if run.overflow:
        raise PluginExecError(f"plugin {name} printed more than {MAX_STDOUT} bytes", ref=ref)
    how = (f"killed by signal {-run.status}" if run.status is not None and run.status < 0
           else f"exit status {run.status}")
    if not stdout.strip():
        raise PluginExecError(f"plugin {name} failed ({how}) with no output", details=excerpt(b"", stderr),
                              ref=ref)
    try:
        obj = json.loads(stdout)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("code"), int) and not isinstance(obj["code"], bool):
        details = obj.get("details")
        raise CNIError(obj["code"], str(obj.get("msg", "")),
                       details=details if isinstance(details, str) else "", ref=ref)
    raise PluginExecError(f"plugin {name} failed ({how}) and its output is not a CNI error",
                          details=excerpt(stdout, stderr), ref=ref, code=CniCode.DECODING_FAILURE)


def excerpt(stdout: bytes, stderr: bytes) -> str:
    """The first ~200 bytes the plugin printed and the tail of its stderr, for messages."""
    parts = []
    if stdout:
        head = stdout[:200].decode(errors="replace")
        parts.append(f"stdout {head!r}{'...' if len(stdout) > 200 else ''}")
    if stderr:
        parts.append(f"stderr {stderr.decode(errors='replace').strip()!r}")
    return "; ".join(parts)
