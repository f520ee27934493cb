"""Running one CNI plugin binary: libcni's pkg/invoke, built for a low per-call cost.

asyncio's subprocess support starts a watcher thread per child on Python 3.11 and wraps every
pipe in a transport; a CNI call needs none of that. Here a plugin is started with
os.posix_spawn (glibc's clone(CLONE_VFORK) path) in its own process group, stdin is written
into the pipe before the plugin starts (as far as it fits), and the loop watches three raw fds:
stdout, stderr and a pidfd for the exit. A timeout kills the whole process group.
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

from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginRef, PluginTimeout

log = logging.getLogger(__name__)

MAX_STDOUT = 16 << 20  # a result is a few KiB; more is a broken or hostile plugin
STDERR_TAIL = 8 << 10
KILL_GRACE = 2.0  # after SIGKILL, how long to wait for the pipes to close before giving up
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
        ref = PluginRef(plugin=os.path.basename(plugin_path), command=env.get("CNI_COMMAND", ""))
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
                                              ref=ref) from None
                    await asyncio.sleep(min(0.05 * 2 ** attempt, max(0.0, deadline - loop.time())))
                    if loop.time() >= deadline:
                        raise PluginTimeout(f"plugin {plugin_path} stayed busy (ETXTBSY) for {timeout}s",
                                            ref=ref) from None
                except ValueError as exc:  # NUL in an env value or argument
                    raise PluginExecError(f"cannot run plugin {plugin_path}: {exc}", ref=ref) from None
            await run.wait(deadline)
        except BaseException:
            run.abandon()
            raise
        return _outcome(run, plugin_path, ref, timeout)


class _Run:
    """One child: its pipes, its pidfd, and the callbacks that collect them.

    The exit is observed with waitid(WNOWAIT), which leaves the leader a zombie until the
    pipes are drained: while it is unreaped its process group ID cannot be reused, so a
    killpg() at the timeout can never hit an unrelated group.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, stdin: bytes) -> None:
        self.loop = loop
        self.stdin = memoryview(stdin)
        self.pid = 0
        self.pidfd = -1
        self.fds: dict[str, int] = {}  # parent ends still open: "in", "out", "err"
        self.child_ends: list[int] = []  # the child's ends, until it is spawned
        self.stdout: list[bytes] = []
        self.stdout_len = 0
        self.stderr = bytearray()
        self.status: int | None = None  # exit code, or -signal
        self.reaped = False
        self.abandoned = False
        self.timed_out = False
        self.overflow = False
        self.done = loop.create_future()

    def spawn(self, path: str, env: dict[str, str]) -> None:
        if not self.child_ends:
            self._pipes()
        self.pid = os.posix_spawn(
            path, [path], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, self.child_ends[0], 0),
                          (os.POSIX_SPAWN_DUP2, self.child_ends[1], 1),
                          (os.POSIX_SPAWN_DUP2, self.child_ends[2], 2)],
            setpgroup=0, setsigdef=_RESTORE_SIGNALS, setsigmask=())
        for fd in self.child_ends:
            os.close(fd)
        self.child_ends = []
        self.pidfd = os.pidfd_open(self.pid)
        self.loop.add_reader(self.pidfd, self._on_exit)
        self.loop.add_reader(self.fds["out"], self._on_stdout)
        self.loop.add_reader(self.fds["err"], self._on_stderr)
        if "in" in self.fds:
            self.loop.add_writer(self.fds["in"], self._on_stdin)

    def _pipes(self) -> None:
        in_r, in_w = _pipe()
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        self.child_ends = [in_r, out_w, err_w]
        self.fds = {"in": in_w, "out": out_r, "err": err_r}
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        # a config fits in the empty pipe: write it before the spawn and never watch stdin
        if self.stdin:
            self.stdin = self.stdin[os.write(in_w, self.stdin):]
        if not self.stdin:
            os.close(self.fds.pop("in"))

    def _on_stdin(self) -> None:
        try:
            self.stdin = self.stdin[os.write(self.fds["in"], self.stdin):]
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the plugin exited without reading everything
            self.stdin = self.stdin[:0]
        if not self.stdin:
            self._close("in")

    # Readers drain until the pipe is empty: after the plugin's last write its EOF is usually
    # there already, and every loop iteration saved is an epoll round trip.
    def _on_stdout(self) -> None:
        while "out" in self.fds:
            try:
                data = os.read(self.fds["out"], 1 << 18)
            except BlockingIOError:
                return
            if not data:
                self._close("out")
                return
            self.stdout.append(data)
            self.stdout_len += len(data)
            if self.stdout_len > MAX_STDOUT:
                self.overflow = True
                self.kill()
                self._close("out")

    def _on_stderr(self) -> None:
        while "err" in self.fds:
            try:
                data = os.read(self.fds["err"], 1 << 16)
            except BlockingIOError:
                return
            if not data:
                self._close("err")
                return
            self.stderr += data
            if len(self.stderr) > 2 * STDERR_TAIL:
                del self.stderr[:-STDERR_TAIL]

    def _on_exit(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else: the status is lost
            info, self.status, self.reaped = None, 255, True
        else:
            if info is None:
                return
            self.status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self.loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = -1
        if self.abandoned:
            self._reap()
            return
        # the plugin is gone: its output is most likely all there, collect it in this iteration
        self._on_stdout()
        self._on_stderr()
        self._check_done()

    def _close(self, name: str) -> None:
        fd = self.fds.pop(name)
        if name == "in":
            self.loop.remove_writer(fd)
        else:
            self.loop.remove_reader(fd)
        os.close(fd)
        self._check_done()

    def _check_done(self) -> None:
        if self.status is not None and "out" not in self.fds and "err" not in self.fds \
                and not self.done.done():
            self._reap()
            self.done.set_result(None)

    def _reap(self) -> None:
        if self.pid and not self.reaped:
            self.reaped = True
            try:
                os.waitpid(self.pid, 0)  # a zombie by now: returns at once
            except ChildProcessError:
                pass

    def kill(self) -> None:
        """SIGKILL to the plugin's whole process group."""
        if self.pid and not self.reaped:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def wait(self, deadline: float) -> None:
        timer = self.loop.call_at(deadline, self._on_timeout)
        try:
            await self.done
        finally:
            timer.cancel()

    def _on_timeout(self) -> None:
        if self.done.done():  # finished in the same loop iteration
            return
        self.timed_out = True
        self.kill()
        # a grandchild that left the group may hold stdout open: stop waiting for EOF then
        self.loop.call_later(KILL_GRACE, self._give_up)

    def _give_up(self) -> None:
        if not self.done.done():
            self.abandon()
            self.done.set_result(None)

    def abandon(self) -> None:
        """Stops collecting (cancelled, failed, or given up): kill, close our pipe ends, and
        leave the pidfd watched so the child is still reaped whenever it dies."""
        self.kill()
        self.abandoned = True
        for name in list(self.fds):
            fd = self.fds.pop(name)
            if name == "in":
                self.loop.remove_writer(fd)
            else:
                self.loop.remove_reader(fd)
            os.close(fd)
        for fd in self.child_ends:
            os.close(fd)
        self.child_ends = []
        if self.pid and (self.status is not None or self.pidfd < 0):
            # exited, or never watched (pidfd_open failed): it was just SIGKILLed, so the
            # wait is short
            self._reap()


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    return _above_stdio(r), _above_stdio(w)


def _above_stdio(fd: int) -> int:
    """Moves a pipe end off 0-2 (possible if the daemon runs with stdio closed): a dup2 onto
    itself in the child would keep O_CLOEXEC and the plugin would lose that stream."""
    if fd >= 3:
        return fd
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return new


def _outcome(run: _Run, plugin_path: str, ref: PluginRef, timeout: float) -> bytes:
    stdout = b"".join(run.stdout)
    stderr = bytes(run.stderr[-STDERR_TAIL:])
    name = os.path.basename(plugin_path)
    if run.timed_out:
        raise PluginTimeout(f"plugin {name} killed after {timeout:g}s timeout",
                            details=excerpt(stdout, stderr), ref=ref)
    if run.overflow:
        raise PluginExecError(f"plugin {name} printed more than {MAX_STDOUT} bytes", ref=ref)
    if run.status == 0:
        if stderr:
            log.debug("plugin %s %s stderr: %s", name, ref.command, stderr.decode(errors="replace"))
        out = PluginOutput(stdout)
        out.stderr = stderr
        return out
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
