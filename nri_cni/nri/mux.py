"""NRI's connection multiplexer (containerd/nri pkg/net/multiplex), without any I/O.

NRI runs two ttrpc connections over one socket. Each chunk on the socket has an 8-byte header,
u32 BE connection id and u32 BE length, then that many bytes of the connection's byte stream.
Id 0 is reserved; on 1 the runtime calls the plugin, on 2 the plugin calls the runtime.
Chunks hold at most one ttrpc frame's worth (10 + 4 MiB); frames may still be split across
chunks, so the payloads of one id are a byte stream, not messages.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from nri_cni.errors import ProtocolError
from nri_cni.ttrpc.buffer import HeaderBuffer

HEADER = struct.Struct(">II")
HEADER_SIZE = HEADER.size
RESERVED_CONN = 0
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
MAX_PAYLOAD = 10 + (4 << 20)


class MuxProtocolError(ProtocolError):
    """The socket's byte stream broke the multiplexer's framing; the trunk is unusable."""


def encode(conn_id: int, data: bytes) -> bytes:
    """The chunks carrying data on conn_id, split at MAX_PAYLOAD as the Go mux does."""
    if len(data) <= MAX_PAYLOAD:
        return HEADER.pack(conn_id, len(data)) + data
    parts: list[bytes | memoryview] = []
    with memoryview(data) as view:
        for start in range(0, len(data), MAX_PAYLOAD):
            piece = view[start : start + MAX_PAYLOAD]
            parts += (HEADER.pack(conn_id, len(piece)), piece)
        return b"".join(parts)


class MuxDecoder:
    """Socket bytes in, (conn_id, payload) out, for the ids in `conn_ids` (others dropped)."""

    def __init__(self, conn_ids: Iterable[int]) -> None:
        self._ids = frozenset(conn_ids) - {RESERVED_CONN}
        self._in = HeaderBuffer(HEADER)
        self._error: MuxProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._in.feed(data)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return self

    def __next__(self) -> tuple[int, bytes]:
        while True:
            if self._error is not None:
                raise self._error
            header = self._in.peek_header()
            if header is None:
                raise StopIteration
            conn_id, length = header
            if length > MAX_PAYLOAD:
                self._error = MuxProtocolError(
                    f"mux chunk of {length} bytes exceeds {MAX_PAYLOAD} (conn {conn_id})"
                )
                raise self._error
            payload = self._in.take(length)
            if payload is None:
                raise StopIteration
            if conn_id in self._ids and length:
                return conn_id, payload
