"""The local socket's protocol: a request read back as it was encoded; a frame too long, cut short
or malformed is a LocalProtocolError."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.local import proto as localproto


def test_local_protocol_round_trip_and_limits():
    async def scenario():
        reader = asyncio.StreamReader()
        reader.feed_data(localproto.encode_request([("CNI_COMMAND", "ADD"), ("CNI_ARGS", "a=b;c=d")], b"{}"))
        reader.feed_eof()
        header, body = await localproto.read_request(reader)
        assert header == {"CNI_COMMAND": "ADD", "CNI_ARGS": "a=b;c=d"} and body == b"{}"
        for raw in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"\x00\x00\x00\x01x\x00\x00\x00\x00"):
            reader = asyncio.StreamReader()
            reader.feed_data(raw)
            reader.feed_eof()
            with pytest.raises(localproto.LocalProtocolError):
                await localproto.read_request(reader)

    asyncio.run(scenario())
