"""Awaitables run a bounded number at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def at_once(items: Sequence[T], fn: Callable[[T], Awaitable[R]], parallel: int) -> list[R]:
    """fn(item) for every item, `parallel` at a time, the results in the items' order; every
    call runs to its end, then the first error is raised."""
    slots = asyncio.Semaphore(parallel)

    async def one(item: T) -> R:
        async with slots:
            return await fn(item)

    done = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    out: list[R] = []
    for result in done:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out
