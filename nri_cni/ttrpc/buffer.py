"""The receive buffer both wire decoders share (ttrpc frames, NRI mux chunks).

Bytes are appended as they arrive and consumed header by header from a read offset; the consumed
prefix is dropped only when the buffer empties or once 64 KiB of it piles up, so a stream of
small frames costs no copying, and a large one is copied once, when it is handed out.
"""

from __future__ import annotations

import struct
from typing import Any

_COMPACT_AT = 64 << 10


class HeaderBuffer:
    def __init__(self, header: struct.Struct) -> None:
        self._header = header
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos

    def peek_header(self) -> tuple[Any, ...] | None:
        """The next header's fields, or None until all of it has arrived."""
        if len(self._buf) - self._pos < self._header.size:
            self._compact()
            return None
        return self._header.unpack_from(self._buf, self._pos)

    def take(self, length: int) -> bytes | None:
        """Consumes the header just peeked and the `length` bytes after it; None until they
        have all arrived (nothing is consumed then)."""
        start = self._pos + self._header.size
        end = start + length
        if len(self._buf) < end:
            self._compact()
            return None
        with memoryview(self._buf) as view:
            data = bytes(view[start:end])
        self._pos = end
        return data

    def _compact(self) -> None:
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos >= _COMPACT_AT:
            del self._buf[: self._pos]
            self._pos = 0
