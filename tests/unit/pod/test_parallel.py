"""pod/parallel.py: `at_once` keeps the items' order and raises the first error only once
every call has ended."""

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
