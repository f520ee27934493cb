"""The local socket's closed connections (asyncio transports, each a reference cycle) are
collected every COLLECT_EVERY connections, not left to the daemon's rare automatic collections
(nri_cni/cli/gctune.py): counted after many connections, with the collection off as control."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from nri_cni.daemon.cycles import COLLECT_EVERY, CycleCollector, due
from tests.support.unstarted import daemon_for

CONNECTIONS = 3 * COLLECT_EVERY + 10


@pytest.mark.parametrize(
    ("closed", "every", "expected"), [(0, 4, False), (3, 4, False), (4, 4, True), (5, 4, True)]
)
def test_a_collection_is_due_after_every_connections(closed, every, expected):
    assert due(closed, every) is expected


def test_the_collector_collects_once_per_every_connections():
    calls: list[int] = []
    collector = CycleCollector(lambda: calls.append(1), every=4)
    for _ in range(3):
        collector.connection_closed()
    assert calls == []  # control: one short of `every`
    for _ in range(9):
        collector.connection_closed()
    assert (len(calls), collector.closed) == (3, 0)


def _closed_transports() -> int:
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, asyncio.Transport)
        and type(o).__name__ == "_SelectorSocketTransport"
        and o.is_closing()
    )


@pytest.mark.parametrize("collect", [True, False])
def test_closed_connections_of_the_local_socket_do_not_pile_up(tmp_path: Path, collect: bool):
    local = daemon_for(tmp_path).local
    if not collect:
        local.closed = None  # control: only the automatic collector, which the test holds off
    done = asyncio.Queue()
    served = local._serve

    async def serve(reader, writer):
        await served(reader, writer)
        done.put_nowait(None)

    local._serve = serve  # type: ignore[method-assign]

    async def scenario() -> int:
        await local.start()
        try:
            for _ in range(CONNECTIONS):
                _, writer = await asyncio.open_unix_connection(str(tmp_path / "daemon.sock"))
                writer.close()  # a request cut short: the server closes its side too
                await writer.wait_closed()
                await done.get()
            await asyncio.sleep(0)  # the last transport's connection_lost
            return _closed_transports()
        finally:
            await local.close()

    gc.collect()
    gc.disable()  # as the daemon's raised threshold: no automatic collection during the test
    try:
        left = asyncio.run(scenario())
    finally:
        gc.enable()
    if collect:
        assert left <= 2 * COLLECT_EVERY
    else:
        assert left >= 2 * CONNECTIONS  # each connection's two ends (the client's are this test's)
