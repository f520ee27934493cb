"""ttrpc message framing (containerd/ttrpc PROTOCOL.md), without any I/O.

A frame is a 10-byte header (u32 BE data length, u32 BE stream id, u8 type, u8 flags) and the
data. `encode_frame` builds one; `FrameDecoder` takes bytes as they arrive (`feed`) and yields
the complete frames (iterate it). Headers are checked as soon as they are complete, so an
oversize length is refused before its data is waited for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from nri_cni.ttrpc.buffer import HeaderBuffer
from nri_cni.ttrpc.errors import TtrpcProtocolError

HEADER = struct.Struct(">IIBB")
HEADER_SIZE = HEADER.size
MAX_DATA = 4 << 20
# Keep the consumed prefix of the receive buffer until it is this large: dropping it is a
# memmove of everything after it, not worth doing per frame.


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


FLAG_REMOTE_CLOSED = 0x01
FLAG_REMOTE_OPEN = 0x02  # Request only
FLAG_NO_DATA = 0x04  # Data only

# The flag bits PROTOCOL.md defines per type; any other bit is a protocol error.
_ALLOWED_FLAGS = {
    MessageType.REQUEST: FLAG_REMOTE_CLOSED | FLAG_REMOTE_OPEN,
    MessageType.RESPONSE: 0,
    MessageType.DATA: FLAG_REMOTE_CLOSED | FLAG_NO_DATA,
}


@dataclass(frozen=True, slots=True)
class Frame:
    stream_id: int
    type: MessageType
    flags: int
    data: bytes


def encode_frame(stream_id: int, msg_type: MessageType, flags: int, data: bytes) -> bytes:
    if len(data) > MAX_DATA:
        raise TtrpcProtocolError(f"message of {len(data)} bytes exceeds ttrpc's {MAX_DATA}")
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


def _check_header(length: int, stream_id: int, msg_type: int, flags: int) -> MessageType:
    """The header's type, or TtrpcProtocolError if the header is malformed."""
    if length > MAX_DATA:
        raise TtrpcProtocolError(f"frame of {length} bytes exceeds ttrpc's {MAX_DATA}")
    if stream_id == 0:
        raise TtrpcProtocolError("frame on stream 0")
    try:
        kind = MessageType(msg_type)
    except ValueError:
        raise TtrpcProtocolError(f"unknown message type {msg_type}") from None
    if flags & ~_ALLOWED_FLAGS[kind]:
        raise TtrpcProtocolError(f"flags {flags:#04x} not defined for {kind.name}")
    if kind is MessageType.REQUEST and flags == FLAG_REMOTE_CLOSED | FLAG_REMOTE_OPEN:
        raise TtrpcProtocolError("request flagged both remote-open and remote-closed")
    return kind


class FrameDecoder:
    """Bytes in, frames out. Raises TtrpcProtocolError, then keeps raising it."""

    def __init__(self) -> None:
        self._in = HeaderBuffer(HEADER)
        self._error: TtrpcProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._in.feed(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return self._in.buffered

    def __iter__(self) -> FrameDecoder:
        return self

    def __next__(self) -> Frame:
        if self._error is not None:
            raise self._error
        header = self._in.peek_header()
        if header is None:
            raise StopIteration
        length, stream_id, msg_type, flags = header
        try:
            kind = _check_header(length, stream_id, msg_type, flags)
        except TtrpcProtocolError as exc:
            self._error = exc
            raise
        data = self._in.take(length)
        if data is None:
            raise StopIteration
        return Frame(stream_id, kind, flags, data)
