"""A connection to the daemon's local socket closed before its first byte is no request: the
compiled shim makes one before its config has come and leaves it unused when the config names
another socket, so the daemon neither answers nor logs it; a request begun and cut short is
still refused as malformed (the control)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.support.harness import run
from tests.support.secharness import netns_path, shim_config, started

MALFORMED = "local socket: malformed request"


@pytest.mark.parametrize("sent, logged", [(b"", False), (b"\x00\x00", True)], ids=["nothing", "cut-short"])
def test_a_connection_that_sent_nothing_is_not_logged(node, caplog, sent, logged):
    netns_path(node)
    cfg = shim_config(node)

    async def scenario():
        h = await started(node, cfg)
        try:
            with caplog.at_level(logging.INFO, logger="nri_cni.local"):
                reader, writer = await asyncio.open_unix_connection(cfg["daemon"]["socket"])
                writer.write(sent)
                await writer.drain()
                writer.write_eof()
                assert await reader.read() == b""  # the daemon closed it, answering nothing
                writer.close()
            assert h.daemon.local.guard.open == 0
        finally:
            await h.stop()

    run(scenario())
    assert any(MALFORMED in r.getMessage() for r in caplog.records) is logged
