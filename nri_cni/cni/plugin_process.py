"""One plugin process (see nri_cni.cni.exec): spawned with posix_spawn in its own process
group, stdin a memfd, stdout and stderr non-blocking pipes read at the exit (or as it writes
after DRAIN_AFTER), the exit watched on a pidfd, the group killed at the timeout."""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import os
import signal

MAX_STDOUT = 16 << 20  # a result is a few KiB; more is a broken or hostile plugin
STDERR_TAIL = 8 << 10  # kept of a plugin's stderr, for messages
DRAIN_AFTER = 0.05  # a plugin still running then gets its pipes read as it writes
_OUT_CHUNK = 1 << 18  # per read; more than a pipe holds by default
_ERR_CHUNK = 1 << 16
KILL_GRACE = 2.0  # after SIGKILL, how long to wait for the exit before giving up on it

# The nice value of the plugins the current task starts (0: the daemon's own). GC's DELs run
# theirs at a lower priority, so that a pod's ADD beside them gets the CPUs (nri_cni/pod/upkeep.py).
PLUGIN_NICE: contextvars.ContextVar[int] = contextvars.ContextVar("plugin_nice", default=0)

# Every signal a plugin starts with at its default disposition (with setsigmask=(): none
# blocked), whatever the daemon inherited: Python ignores SIGPIPE and SIGXFSZ, nohup and some
# supervisors SIGHUP and SIGINT, and an ignored signal passes through exec to what plugins run.
DEFAULT_SIGNALS = frozenset(signal.valid_signals())


_sealed = False


def seal_inherited_fds() -> None:
    """Marks close-on-exec every descriptor this process inherited (its own are so already,
    PEP 446), once: posix_spawn passes every inheritable descriptor to a plugin, and a daemon
    started by a runtime (the pre-registered launch's fd 3) or a shell may hold some."""
    global _sealed
    if _sealed:
        return
    _sealed = True
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(fd) for fd in range(3, 1024)]
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # closed meanwhile (the listing's own descriptor)


class ChildRun:
    """One child: its stdin file, its output pipes, its exit, and the callbacks that collect
    them.

    Written lean (it runs for every plugin call): the pidfd turns readable when the plugin has
    exited and is a zombie, so the output is read and the child reaped in that one callback.
    Until it is reaped its process group ID cannot be reused, so a killpg() at the timeout can
    never hit an unrelated group.
    """

    __slots__ = (
        "loop",
        "stdin",
        "pid",
        "pidfd",
        "fds",
        "stdout",
        "stdout_len",
        "stderr",
        "status",
        "reaped",
        "abandoned",
        "timed_out",
        "overflow",
        "draining",
        "done",
        "deadline",
        "timer",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, stdin: bytes) -> None:
        self.loop = loop
        self.stdin = stdin
        self.pid = 0
        self.pidfd = -1
        # stdin memfd, stdout read end, stderr read end, then the child's ends until spawned
        self.fds: list[int] = []
        self.stdout: list[bytes] = []
        self.stdout_len = 0
        self.stderr = bytearray()
        self.status: int | None = None  # exit code, or -signal
        self.reaped = False
        self.abandoned = False
        self.timed_out = False
        self.overflow = False
        self.draining = False
        self.done = loop.create_future()
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def spawn(self, path: str, env: dict[str, str]) -> None:
        seal_inherited_fds()
        fds = self.fds or self._files()
        self.pid = os.posix_spawn(
            path,
            [path],
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, fds[0], 0),
                (os.POSIX_SPAWN_DUP2, fds[3], 1),
                (os.POSIX_SPAWN_DUP2, fds[4], 2),
            ],
            setpgroup=0,
            setsigdef=DEFAULT_SIGNALS,
            setsigmask=(),
        )
        nice = PLUGIN_NICE.get()
        if nice:
            # the process group the plugin leads (setpgroup=0): every thread it has started
            # by now (a Go runtime's), and what it starts later inherits the value
            try:
                os.setpriority(os.PRIO_PGRP, self.pid, nice)
            except OSError:
                pass  # it already exited, or no permission: it runs at the daemon's priority
        os.close(fds.pop())
        os.close(fds.pop())
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
            if fd < 3:
                fd = _above_stdio(fd)
            fds.append(fd)
            view = memoryview(self.stdin)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
            out_r, out_w = _pipe()
            err_r, err_w = _pipe()
            fds += (out_r, err_r, out_w, err_w)
            os.set_blocking(out_r, False)
            os.set_blocking(err_r, False)
        except OSError:
            self._close_files()
            raise
        return fds

    def start_timer(self, deadline: float) -> None:
        """One timer at a time: first DRAIN_AFTER, then the deadline."""
        self.deadline = deadline
        self.timer = self.loop.call_at(min(deadline, self.loop.time() + DRAIN_AFTER), self._on_timer)

    def _on_timer(self) -> None:
        if self.done.done():
            return
        if self.loop.time() >= self.deadline:
            self.on_timeout()
            return
        # the plugin still runs: read its pipes as it writes, so a full pipe never blocks it
        self.timer = self.loop.call_at(self.deadline, self.on_timeout)
        if not self.abandoned and len(self.fds) == 3:
            self.draining = True
            for i, reader in ((1, self._read_stdout), (2, self._read_stderr)):
                if self.fds[i] >= 0:
                    self.loop.add_reader(self.fds[i], reader)

    # A read shorter than asked has taken all the pipe held: the next one would only find it
    # empty (EAGAIN), so stop there and save the call.
    def _read_stdout(self) -> None:
        fd = self.fds[1]
        while fd >= 0:
            try:
                data = os.read(fd, _OUT_CHUNK)
            except BlockingIOError:
                return
            if not data:  # EOF: nothing more can come; stop watching
                if self.draining:
                    self.loop.remove_reader(fd)
                os.close(fd)
                self.fds[1] = -1
                return
            self.stdout.append(data)
            self.stdout_len += len(data)
            if self.stdout_len > MAX_STDOUT:
                self.overflow = True
                self.kill()
                self.stdout = []
                if self.draining:
                    self.loop.remove_reader(fd)
                os.close(fd)
                self.fds[1] = -1
                return
            if len(data) < _OUT_CHUNK:
                return

    def _read_stderr(self) -> None:
        fd = self.fds[2]
        while fd >= 0:
            try:
                data = os.read(fd, _ERR_CHUNK)
            except BlockingIOError:
                return
            if not data:
                if self.draining:
                    self.loop.remove_reader(fd)
                os.close(fd)
                self.fds[2] = -1
                return
            self.stderr += data
            if len(self.stderr) > 2 * STDERR_TAIL:
                del self.stderr[:-STDERR_TAIL]
            if len(data) < _ERR_CHUNK:
                return

    def _on_exit(self) -> None:
        """The pidfd is readable: the plugin has exited."""
        if self.reaped:  # reported again before _close_all ran
            return
        if self.abandoned:
            self._close_all()
            self._reap(0)
            return
        if not self.done.done():
            self._collect()
            self._reap(0)
            self.done.set_result(None)
        # Unwatching and closing can wait: scheduled after the caller's wakeup, this runs once
        # the caller has gone on (parsed the result, started the next plugin).
        self.loop.call_soon(self._close_all)

    def _close_all(self) -> None:
        if self.pidfd >= 0:
            self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        self._close_files()

    def _poll_exit(self) -> None:
        """The fallback without a pidfd."""
        if self.reaped:
            return
        if not self.abandoned and not self.done.done():
            try:
                exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                exited = True  # reaped by someone else
            if not exited:
                self.loop.call_later(0.005, self._poll_exit)
                return
            self._collect()
            self._reap(0)
            self._close_files()
            self.done.set_result(None)
        elif not self._reap(os.WNOHANG):
            self.loop.call_later(0.005, self._poll_exit)

    def _collect(self) -> None:
        """The plugin has exited: what it wrote is in the pipes (or was read while draining).
        EOF need not be seen: the exit ends the call, even if a helper the plugin left behind
        still holds a pipe."""
        self._read_stdout()
        self._read_stderr()

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
        for i, fd in enumerate(fds):
            if fd >= 0:
                if self.draining and i in (1, 2):
                    self.loop.remove_reader(fd)
                os.close(fd)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    return (r if r > 2 else _above_stdio(r)), (w if w > 2 else _above_stdio(w))


def _above_stdio(fd: int) -> int:
    """Moves an fd off 0-2 (possible if the daemon runs with stdio closed): a dup2 onto
    itself in the child would keep O_CLOEXEC and the plugin would lose that stream."""
    if fd >= 3:
        return fd
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return new
