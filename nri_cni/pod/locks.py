"""Serialisation rules of the CNI spec, for a daemon that serves many pods at once.

- Operations on one pod (ADD, DEL, CHECK of any of its networks) never overlap.
- Different pods proceed in parallel.
- GC's DELs of stale pods are ordinary DELs of other containers: each runs under its own pod's
  lock (`pod(pod_id, gc=True)`), beside the operations on live pods.
- GC yields to pods (`gc_slot`): while a pod operation waits or runs, GC starts no plugin; an
  operation waiting for a pod lock GC holds is no reason (GC's DEL of that pod must end first).
  GC starts at most one plugin per turn of the event loop, so that a pod's request is read
  between two of them.
- GC's plugin verb runs alone (`exclusive`): it waits for every pod operation in flight, and new
  pod operations wait for it. A waiting GC holds back new pod operations so that a busy node
  cannot starve it.
- One GC at a time (`gc_turn`): two would DEL the same stale pods twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class PodLocks:
    def __init__(self) -> None:
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._pod_waiters: dict[str, int] = {}
        self._gc_waiters: dict[str, int] = {}  # of _pod_waiters, those that are GC's
        self._gc_held: set[str] = set()  # the pods whose lock GC holds
        self._operations = 0  # pod operations holding or waiting for a pod lock (not GC's)
        self._gc_slots = 0  # GC's plugin execs running
        self._active = 0  # pod operations inside their critical section
        self._gc_waiting = 0
        self._gc_running = False
        self._cond = asyncio.Condition()
        self._gc_turn = asyncio.Lock()

    @asynccontextmanager
    async def pod(self, pod_id: str, *, gc: bool = False) -> AsyncIterator[None]:
        """The pod's lock. `gc`: taken by GC for a stale pod, which is not an operation in
        flight (`pod_ids`): GC must not count its own lock as a reason to keep the pod."""
        lock = self._pod_locks.get(pod_id)
        if lock is None:
            lock = self._pod_locks[pod_id] = asyncio.Lock()
        self._pod_waiters[pod_id] = self._pod_waiters.get(pod_id, 0) + 1
        if gc:
            self._gc_waiters[pod_id] = self._gc_waiters.get(pod_id, 0) + 1
        else:
            self._operations += 1
        counted = not gc
        try:
            async with lock:
                if gc:
                    self._gc_held.add(pod_id)
                try:
                    async with self._cond:
                        await self._cond.wait_for(lambda: not self._gc_running and not self._gc_waiting)
                        self._active += 1
                    try:
                        yield
                    finally:
                        async with self._cond:
                            self._active -= 1
                            if counted:  # before the wake-up: a GC waiting in gc_slot sees it gone
                                self._operations -= 1
                                counted = False
                            self._cond.notify_all()
                finally:
                    if gc:
                        self._gc_held.discard(pod_id)
        finally:
            if counted:  # cancelled while waiting
                self._operations -= 1
            if gc:
                self._gc_waiters[pod_id] -= 1
                if not self._gc_waiters[pod_id]:
                    del self._gc_waiters[pod_id]
            # Forget the lock once nobody holds or waits for it: pods come and go forever.
            self._pod_waiters[pod_id] -= 1
            if not self._pod_waiters[pod_id]:
                del self._pod_waiters[pod_id]
                del self._pod_locks[pod_id]
            if counted:  # the counts are right again: a GC waiting in gc_slot looks again
                async with self._cond:
                    self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._gc_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._gc_running and self._active == 0)
            finally:
                self._gc_waiting -= 1
            self._gc_running = True
        try:
            yield
        finally:
            async with self._cond:
                self._gc_running = False
                self._cond.notify_all()

    def operations_in_flight(self) -> int:
        """Pod operations running or waiting, but for those waiting for a pod lock GC holds."""
        behind_gc = sum(self._pod_waiters[p] - self._gc_waiters.get(p, 0) for p in self._gc_held)
        return self._operations - behind_gc

    @asynccontextmanager
    async def gc_slot(self, parallel: int) -> AsyncIterator[None]:
        """A slot for one plugin exec of GC's: `parallel` at a time, none while a pod operation
        is in flight (`operations_in_flight`). GC's DELs and a pod's ADD share the CPUs and the
        kernel's locks (RTNL, iptables'): a live pod comes first, GC's plugins already started
        run on, and GC starts its next plugin when no operation is left.

        One slot per turn of the event loop: the slot is given after a turn taken under the
        condition's lock (the other GC tasks queue behind it), so that the loop reads its
        sockets between two of GC's plugin starts and a pod's request that came meanwhile is
        counted before GC starts another (GC's first `parallel` plugins, started in one go, kept
        a RunPodSandbox that came meanwhile unread until the last of them had started)."""

        def free() -> bool:
            return self._gc_slots < parallel and not self.operations_in_flight()

        async with self._cond:
            while True:
                await self._cond.wait_for(free)
                await asyncio.sleep(0)  # the turn: new requests are read, their operations counted
                if free():
                    break
            self._gc_slots += 1
        try:
            yield
        finally:
            async with self._cond:
                self._gc_slots -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def gc_turn(self) -> AsyncIterator[None]:
        """One GC at a time (the timer, a Synchronize, `nri-cni gc` and the runtime's GC)."""
        async with self._gc_turn:
            yield

    def pod_ids(self) -> set[str]:
        """Pods with an operation in flight (or waiting for one); GC's own locks are none."""
        return {p for p, n in self._pod_waiters.items() if n > self._gc_waiters.get(p, 0)}

    def busy(self, pod_id: str) -> bool:
        """Anyone holds or waits for the pod's lock (an operation, or GC)."""
        return pod_id in self._pod_locks

    def __len__(self) -> int:
        return len(self._pod_locks)
