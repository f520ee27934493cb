"""The pod locks: operations on one pod run one at a time, different pods in parallel, GC alone;
nothing is kept for pods that are gone."""

from __future__ import annotations

import asyncio
import time

import pytest

from nri_cni.pod.locks import PodLocks


def test_one_pod_serialized_pods_parallel_gc_exclusive():
    async def scenario():
        locks = PodLocks()
        spans: list[tuple[str, float, float]] = []

        async def op(pod, name, hold=0.02):
            async with locks.pod(pod):
                t0 = time.monotonic()
                await asyncio.sleep(hold)
                spans.append((name, t0, time.monotonic()))

        async def gc():
            async with locks.exclusive():
                t0 = time.monotonic()
                await asyncio.sleep(0.02)
                spans.append(("gc", t0, time.monotonic()))

        await asyncio.gather(op("a", "a1"), op("a", "a2"), op("b", "b1"), gc(), op("b", "b2"))
        by = {n: (s, e) for n, s, e in spans}

        def overlap(x, y):
            return by[x][0] < by[y][1] and by[y][0] < by[x][1]

        assert not overlap("a1", "a2") and not overlap("b1", "b2")
        assert overlap("a1", "b1")  # different pods in parallel
        for name in ("a1", "a2", "b1", "b2"):
            assert not overlap("gc", name)
        assert len(locks) == 0  # nothing kept for pods that are gone

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "holder, waiter, in_flight",
    [
        (None, None, 0),
        ("op", None, 1),  # an operation runs
        ("op", "op", 2),  # ... and another waits for its lock
        ("gc", None, 0),  # GC's own lock is no operation
        ("gc", "op", 0),  # an operation waiting for a lock GC holds: GC must go on to free it
    ],
)
def test_operations_in_flight_leave_out_those_behind_gc(holder, waiter, in_flight):
    """What GC yields to (gc_slot): the control pairs differ in the holder only (op/op 2,
    gc/op 0) or in the waiter only."""

    async def scenario():
        locks = PodLocks()
        release = asyncio.Event()

        async def take(who):
            async with locks.pod("p", gc=who == "gc"):
                await release.wait()

        tasks = [asyncio.create_task(take(w)) for w in (holder, waiter) if w is not None]
        for _ in range(10):
            await asyncio.sleep(0)
        seen = locks.operations_in_flight()
        release.set()
        await asyncio.gather(*tasks)
        assert locks.operations_in_flight() == 0 and len(locks) == 0
        return seen

    assert asyncio.run(scenario()) == in_flight


def test_gc_slot_waits_for_an_operation_that_ends_or_is_cancelled_while_waiting():
    """A GC plugin waiting in gc_slot starts when the last operation ends: also when that one
    was cancelled while it waited for a pod lock (nothing else wakes GC then)."""

    async def scenario():
        locks = PodLocks()
        started: list[str] = []
        hold = asyncio.Event()

        async def op():
            async with locks.pod("p"):
                await hold.wait()

        async def gc_plugin():
            async with locks.gc_slot(2):
                started.append("gc")

        holder = asyncio.create_task(op())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(op())
        gc = asyncio.create_task(gc_plugin())
        for _ in range(10):
            await asyncio.sleep(0)
        assert started == []  # two operations: one runs, one waits
        waiter.cancel()
        for _ in range(10):
            await asyncio.sleep(0)
        assert started == []  # the one running is left
        holder.cancel()
        await gc
        assert started == ["gc"] and len(locks) == 0

    asyncio.run(scenario())
