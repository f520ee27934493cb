"""pod/parallel.py: `at_once` keeps the items' order and its bound, and raises the first error
only once every call has ended."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.pod.parallel import at_once


def test_at_once_keeps_the_order_and_raises_the_first_error_after_all_ended():
    ended = []

    async def call(n: int) -> int:
        await asyncio.sleep(0.001 * (5 - n))
        ended.append(n)
        if n in (1, 3):
            raise ValueError(n)
        return n * 10

    assert asyncio.run(at_once([0, 2, 4], call, 2)) == [0, 20, 40]
    ended.clear()
    with pytest.raises(ValueError, match="1"):
        asyncio.run(at_once([0, 1, 2, 3, 4], call, 2))
    assert sorted(ended) == [0, 1, 2, 3, 4]


def test_at_once_keeps_the_order_and_the_bound():
    """Three calls, two at a time: two run together, never three (each takes a few turns of
    the loop, so without the bound all three would be running at once)."""

    async def main():
        running = 0
        most = 0

        async def fn(item: int) -> int:
            nonlocal running, most
            running += 1
            most = max(most, running)
            for _ in range(3):
                await asyncio.sleep(0)
            running -= 1
            return item * 10

        assert await at_once([3, 1, 2], fn, 2) == [30, 10, 20]
        assert most == 2

    asyncio.run(main())


def test_at_once_runs_every_call_then_raises_the_first_error():
    async def main():
        done = []

        async def fn(item: int) -> int:
            await asyncio.sleep(0)
            if item == 1:
                raise ValueError("one")
            done.append(item)
            return item

        with pytest.raises(ValueError, match="one"):
            await at_once([0, 1, 2], fn, 1)
        assert done == [0, 2]

    asyncio.run(main())
