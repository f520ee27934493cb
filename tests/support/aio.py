"""Fixtures of the ttrpc and NRI tests (their conftests import them): running coroutines (no
pytest-asyncio here) and sockets."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


@pytest.fixture
def arun() -> Callable[..., object]:
    """arun(coro, timeout=60): run a coroutine in a fresh loop, failing it if it hangs."""

    def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await coro

        return asyncio.run(bounded())

    return run


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for unix sockets (tmp_path can exceed sun_path's 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="nct-") as name:
        yield Path(name)


def on_a_loop() -> bool:
    """Whether an event loop runs in the calling thread: a probe that tells work done on the
    loop from work handed to a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def emptied(directory: str | os.PathLike[str]) -> None:
    """Until `directory` lists nothing (a worker thread's unlinks are done), on the loop that
    scheduled them: what nri_cni.safety.files.remove_soon leaves in its trash a moment."""
    while os.path.isdir(directory) and os.listdir(directory):
        await asyncio.sleep(0.001)
