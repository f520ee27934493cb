"""The metrics port under idle connections: they are capped and timed out, so they cannot take
the descriptors the daemon needs for plugins, and pods attach and detach while they are open; a
scrape does not read the cache files each time."""

from __future__ import annotations

import asyncio
import socket

import pytest

from nri_cni.metrics.limits import BackgroundValue
from tests.support.harness import new_pod_id, run
from tests.support.secharness import install_shim, netns_path, normal_add_del, shim_config, started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _scrape(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


async def _eof(reader) -> bool:
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


@pytest.mark.netns
def test_idle_connections_are_capped_and_timed_out_and_pods_still_work(node):
    netns_path(node)
    port = _free_port()
    cfg = shim_config(node, metrics={"listen": f"127.0.0.1:{port}", "max_connections": 16, "timeout": "1s"})

    async def scenario():
        h = await started(node, cfg)
        try:
            shim = install_shim(node, True)
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
            await normal_add_del(shim, node, new_pod_id())  # while they are open
            closed = await asyncio.wait_for(asyncio.gather(*(_eof(r) for r, _ in conns)), 30)
            assert all(closed)
            for _, w in conns:
                w.close()
            guard = h.daemon.metrics.guard
            assert guard.refused >= 300 - 16 and guard.open == 0
            # a scrape does not count the cache files each time: it reads a BackgroundValue
            # (computed once per max age: tests/unit/metrics/test_limits.py)
            for _ in range(20):
                text = await _scrape(port)
            assert "nri_cni_attachments 0" in text
            assert isinstance(h.daemon.metrics.attachments, BackgroundValue)
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())
