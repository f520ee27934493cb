"""A ttrpc connection as a state machine: frames and stream bookkeeping, no I/O.

One side is the CLIENT (it opened the connection: sends requests on odd stream ids and matches
the responses), the other the SERVER (receives requests, answers each once). Only unary calls
are carried, which is all NRI uses. A server answers a streaming request like any other (the
handler layer refuses it) and drops the stream data the client may still send on it.

Use: `receive_data(bytes)`, then iterate the connection for RequestReceived (server) or
ResponseReceived (client) events; `send_request` / `send_response` return the bytes to write.
Everything the peer can get wrong raises TtrpcProtocolError, after which the connection is
dead (every further call raises it again).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from nri_cni.api import rpc_status_pb2, ttrpc_pb2
from nri_cni.errors import GrpcCode
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.framing import (
    FLAG_REMOTE_CLOSED,
    FLAG_REMOTE_OPEN,
    MAX_DATA,
    Frame,
    FrameDecoder,
    MessageType,
    encode_frame,
)

_MAX_STREAM_ID = 0xFFFFFFFF


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


@dataclass(frozen=True, slots=True)
class RequestReceived:
    stream_id: int
    service: str
    method: str
    payload: bytes
    timeout_nano: int
    metadata: tuple[tuple[str, str], ...]
    # False when the client flagged a streaming call (remote-open / remote-closed).
    unary: bool = True


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    stream_id: int
    code: int
    message: str
    payload: bytes


Event = RequestReceived | ResponseReceived


class Connection:
    def __init__(self, role: Role) -> None:
        self.role = role
        self._decoder = FrameDecoder()
        self._error: TtrpcProtocolError | None = None
        # client: ids of calls in flight, and of calls given up on (their answer is dropped)
        self._next_id = 1
        self._pending: set[int] = set()
        self._forgotten: set[int] = set()
        # server: requests not answered yet, the highest id seen, and streams still sending
        self._open: set[int] = set()
        self._last_id = 0
        self._draining: set[int] = set()

    # -- input -------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._decoder.feed(data)

    def __iter__(self) -> Connection:
        return self

    def __next__(self) -> Event:
        if self._error is not None:
            raise self._error
        try:
            while True:
                frame = next(self._decoder)  # StopIteration ends the loop and the iteration
                event = self._handle(frame)
                if event is not None:
                    return event
        except TtrpcProtocolError as exc:
            self._error = exc
            raise

    def _handle(self, frame: Frame) -> Event | None:
        if self.role is Role.SERVER:
            return self._server_frame(frame)
        return self._client_frame(frame)

    def _server_frame(self, frame: Frame) -> Event | None:
        sid = frame.stream_id
        if frame.type is MessageType.REQUEST:
            if sid % 2 == 0:
                raise TtrpcProtocolError(f"request on even stream {sid}: client streams are odd")
            if sid <= self._last_id:
                raise TtrpcProtocolError(
                    f"request on stream {sid} after {self._last_id}: stream ids must increase"
                )
            self._last_id = sid
            req = _parse(ttrpc_pb2.Request, frame.data, "request")
            self._open.add(sid)
            if frame.flags & FLAG_REMOTE_OPEN:
                self._draining.add(sid)
            return RequestReceived(
                sid,
                req.service,
                req.method,
                req.payload,
                req.timeout_nano,
                tuple((kv.key, kv.value) for kv in req.metadata),
                unary=frame.flags == 0,
            )
        if frame.type is MessageType.DATA:
            if sid not in self._draining:
                raise TtrpcProtocolError(f"data on stream {sid}, which is not sending")
            if frame.flags & FLAG_REMOTE_CLOSED:
                self._draining.discard(sid)
            return None
        raise TtrpcProtocolError(f"{frame.type.name} frame sent to the server")

    def _client_frame(self, frame: Frame) -> Event | None:
        sid = frame.stream_id
        if frame.type is not MessageType.RESPONSE:
            raise TtrpcProtocolError(
                f"{frame.type.name} frame on stream {sid}: the client makes unary calls only"
            )
        if sid in self._forgotten:
            self._forgotten.discard(sid)
            return None
        if sid not in self._pending:
            raise TtrpcProtocolError(f"response on stream {sid}, which has no call")
        self._pending.discard(sid)
        resp = _parse(ttrpc_pb2.Response, frame.data, "response")
        status = resp.status
        return ResponseReceived(sid, status.code, status.message, resp.payload)

    # -- output ------------------------------------------------------------------------------

    def send_request(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout_nano: int = 0,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> tuple[int, bytes]:
        """Open a unary call: its stream id and the bytes to write."""
        if self.role is not Role.CLIENT:
            raise TtrpcProtocolError("only the client sends requests")
        if self._error is not None:
            raise self._error
        sid = self._next_id
        if sid > _MAX_STREAM_ID:
            raise TtrpcProtocolError("stream ids exhausted; open a new connection")
        req = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=timeout_nano,
            metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata],
        )
        data = encode_frame(sid, MessageType.REQUEST, 0, req.SerializeToString())
        self._next_id += 2
        self._pending.add(sid)
        return sid, data

    def forget(self, stream_id: int) -> None:
        """The caller gave up on this call (timeout, cancel): drop its answer when it comes."""
        if stream_id in self._pending:
            self._pending.discard(stream_id)
            self._forgotten.add(stream_id)

    def send_response(self, stream_id: int, code: int = 0, message: str = "", payload: bytes = b"") -> bytes:
        """Answer an open request. A payload too big for a frame becomes an error status."""
        if self.role is not Role.SERVER:
            raise TtrpcProtocolError("only the server sends responses")
        if stream_id not in self._open:
            raise TtrpcProtocolError(f"no request open on stream {stream_id}")
        resp = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=message), payload=payload)
        data = resp.SerializeToString()
        if len(data) > MAX_DATA:
            too_big = f"response of {len(data)} bytes exceeds ttrpc's {MAX_DATA}"
            resp = ttrpc_pb2.Response(
                status=rpc_status_pb2.Status(code=GrpcCode.RESOURCE_EXHAUSTED, message=too_big)
            )
            data = resp.SerializeToString()
        self._open.discard(stream_id)
        return encode_frame(stream_id, MessageType.RESPONSE, 0, data)

    def is_open(self, stream_id: int) -> bool:
        """Server: the request on stream_id still waits for its answer."""
        return stream_id in self._open

    @property
    def pending(self) -> int:
        """Calls in flight (client) or requests not answered yet (server)."""
        return len(self._pending) if self.role is Role.CLIENT else len(self._open)


_M = TypeVar("_M", bound=Message)


def _parse(cls: type[_M], data: bytes, what: str) -> _M:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise TtrpcProtocolError(f"undecodable {what}: {exc}") from None
