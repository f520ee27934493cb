"""One NRI socket carrying several ttrpc connections: the asyncio side of the multiplexer.

A Trunk is the asyncio.Protocol of the unix socket. It hands each logical connection's bytes
to that connection's protocol (a TtrpcServer connection or a TtrpcClient) and gives each of
them a Channel to write through. Losing the socket ends every logical connection; closing any
logical connection closes the socket, because NRI has no way to reopen one alone.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping

from nri_cni.nri import mux

log = logging.getLogger(__name__)


class Channel:
    """The Transport of one logical connection (nri_cni.ttrpc.transport.Transport)."""

    __slots__ = ("_trunk", "conn_id")

    def __init__(self, trunk: Trunk, conn_id: int) -> None:
        self._trunk = trunk
        self.conn_id = conn_id

    def write(self, data: bytes) -> None:
        self._trunk.write(self.conn_id, data)

    def close(self) -> None:
        self._trunk.close()


class Trunk(asyncio.Protocol):
    def __init__(self, endpoints: Mapping[int, asyncio.Protocol], name: str = "nri") -> None:
        self.name = name
        self._endpoints = dict(endpoints)
        self._decoder = mux.MuxDecoder(self._endpoints)
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        for conn_id, endpoint in self._endpoints.items():
            endpoint.connection_made(Channel(self, conn_id))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        try:
            self._decoder.feed(data)
            for conn_id, payload in self._decoder:
                self._endpoints[conn_id].data_received(payload)
        except mux.MuxProtocolError as exc:
            log.error("%s: closing the socket: %s", self.name, exc)
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        for endpoint in self._endpoints.values():
            endpoint.connection_lost(exc)
        if not self.closed.done():
            self.closed.set_result(None)

    def write(self, conn_id: int, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(mux.encode(conn_id, data))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def connect(
    endpoints: Mapping[int, asyncio.Protocol],
    *,
    path: str | None = None,
    sock: socket.socket | None = None,
    name: str = "nri",
) -> Trunk:
    """A Trunk over a unix socket: connect to `path`, or adopt a connected `sock`."""
    loop = asyncio.get_running_loop()
    trunk = Trunk(endpoints, name)
    if sock is not None:
        await loop.connect_accepted_socket(lambda: trunk, sock)
    else:
        await loop.create_unix_connection(lambda: trunk, path)
    return trunk
