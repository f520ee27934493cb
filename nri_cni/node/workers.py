"""A few threads that may enter other network namespaces, one at a time, and always come back.

setns(CLONE_NEWNET) moves only the calling thread; a socket made there stays bound to that netns
after the thread returns to its own. So a worker enters a pod's netns just long enough to open one
netlink socket (~12 µs), returns, and reads the netns through that socket from home. A worker that
cannot return (its own netns fd is always open, so only a kernel fault could cause that) must never
run anything again: it ends itself, and the pool starts another in its place.

"Home" is the netns of the thread that made the pool (the daemon's), held open by the pool: every
worker enters it when it starts instead of trusting what it inherited, since a replacement is
started by the stranded worker itself, whose netns is not home.

`enter` is the one way into a pod's netns in nri-cni, and the pool's workers its only callers:
verify's rounds read through one pool, the pods' own operations (the answer's MAC and MTU, a
CRI-O CHECK answered from the records) through another (nri_cni/daemon/app.py), so a pod never
waits behind a round.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsGone(OSError):
    """The path is missing, or is no network namespace (an unmounted bind mount leaves a file)."""


class StrandedWorker(RuntimeError):
    """The worker could not return to its own netns: it stops."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class _Worker(threading.Thread):
    def __init__(self, pool: NetnsWorkers, n: int) -> None:
        super().__init__(name=f"netns-worker-{n}", daemon=True)
        self.pool = pool
        self.home = pool._home

    def run(self) -> None:
        try:
            _setns(self.home)
            broken: StrandedWorker | None = None
        except OSError as exc:  # never home: it fails every job rather than run one elsewhere
            broken = StrandedWorker(f"cannot enter the daemon's netns: {exc}")
            log.error("%s: %s", self.name, broken)
        _local.worker = self
        try:
            while True:
                job = self.pool._jobs.get()
                if job is None:
                    return
                fn, args, fut = job
                if not fut.set_running_or_notify_cancel():
                    continue
                if broken is not None:
                    fut.set_exception(broken)
                    continue
                try:
                    fut.set_result(fn(*args))
                except StrandedWorker as exc:
                    fut.set_exception(exc)
                    log.error("%s: %s; replacing it", self.name, exc)
                    self.pool._replace(self)
                    return
                except BaseException as exc:
                    fut.set_exception(exc)
        finally:
            _local.worker = None
            self.pool._exited()

    def socket_in(self, netns: str, make: Callable[[], socket.socket]) -> socket.socket:
        """`make()` run inside `netns`; this thread is back home when it returns or raises."""
        return enter(netns, self.home, make)


def enter(netns: str, home: int, make: Callable[[], T]) -> T:
    """`make()` run inside `netns` by the calling thread, which is back in `home` (an open netns
    fd) when it returns or raises. NetnsGone: `netns` is missing or no netns any more;
    StrandedWorker: the thread could not return (it must run nothing again)."""
    try:
        target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsGone(errno.ENOENT, "no such file") from None
    try:
        try:
            _setns(target)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise NetnsGone(errno.EINVAL, "not a network namespace any more") from None
            raise
        try:
            return make()
        finally:
            try:
                _setns(home)
            except OSError as exc:
                raise StrandedWorker(f"cannot return to its own netns: {exc}") from exc
    finally:
        os.close(target)


def is_netns(path: str) -> bool:
    """`path` is a namespace file (a netns bind mount, /proc/<pid>/ns/net): on nsfs, like this
    process's own. A file an unmounted netns left behind (or a runtime killed before it mounted
    one) is not: a plugin given it fails ("unknown FS magic")."""
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


_local = threading.local()


def socket_in(netns: str, make: Callable[[], socket.socket]) -> socket.socket:
    """From a job running on a pool worker: `make()` run inside `netns` (see `_Worker.socket_in`)."""
    worker = getattr(_local, "worker", None)
    if worker is None:
        raise RuntimeError("socket_in() runs only on a NetnsWorkers thread")
    return worker.socket_in(netns, make)


class NetnsWorkers:
    """`size` threads started on first use; `submit` returns a concurrent.futures.Future."""

    def __init__(self, size: int = 4) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one worker")
        self.size = size
        self._home = os.open(
            f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC
        )
        self._live = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._started = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the netns pool is closed")
            while len(self._workers) < self.size:
                self._start_locked()
        self._jobs.put((fn, args, fut))
        return fut

    def _start_locked(self) -> None:
        self._started += 1
        self._live += 1
        w = _Worker(self, self._started)
        self._workers.append(w)
        w.start()

    def _replace(self, dead: _Worker) -> None:
        with self._lock:
            if dead in self._workers:
                self._workers.remove(dead)
            if not self._closed:
                self._start_locked()

    def _exited(self) -> None:
        with self._lock:
            self._live -= 1
            self._close_home_locked()

    def _close_home_locked(self) -> None:
        if self._closed and self._live == 0 and self._home >= 0:
            os.close(self._home)
            self._home = -1

    def close(self) -> None:
        """Stops the workers once the queued jobs are done (returns without waiting)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._workers:
                self._jobs.put(None)
            self._close_home_locked()
