"""The pod locks: operations on one pod run one at a time, different pods in parallel, GC alone;
nothing is kept for pods that are gone."""

from __future__ import annotations

import asyncio
import time

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
