"""The asyncio ttrpc server: concurrent unary handlers over any Transport.

Services are plain mappings {"pkg.Service": {"Method": handler}}, a handler being an async
function from the serialized request to the serialized answer. Errors become statuses:
NriCniError → its grpc_code and text, any other exception → UNKNOWN (logged with its traceback),
a name nobody registered → UNIMPLEMENTED. A malformed frame closes the connection (logged);
nothing the peer sends gets out of here.

The transport never cancels a handler. When the request's timeout_nano passes, the caller gets
DEADLINE_EXCEEDED at once and the handler runs on, its answer dropped; when the connection goes,
handlers run on too. A handler here is typically a CNI ADD or DEL: stopping one halfway leaves
an interface or an IP allocation that nothing records, which is worse than finishing late.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from nri_cni.errors import GrpcCode, NriCniError
from nri_cni.ttrpc.connection import Connection, RequestReceived, Role
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.transport import Transport

log = logging.getLogger(__name__)

Handler = Callable[[bytes], Awaitable[bytes]]
Services = Mapping[str, Mapping[str, Handler]]


@dataclass
class RequestDeadline:
    """The deadline of the request a handler serves (the caller's timeout_nano): `expired` is
    set when it passed and the caller got DEADLINE_EXCEEDED instead of the handler's answer.
    A handler that returns while `expired` is False is answered in the same step (nothing is
    awaited in between): its answer went out in time, as far as this side can tell."""

    timeout: float  # seconds; 0: the caller set none
    received: float  # the event loop's time when the request arrived
    expired: bool = False


_DEADLINE: contextvars.ContextVar[RequestDeadline | None] = contextvars.ContextVar(
    "ttrpc_deadline", default=None
)


def request_deadline() -> RequestDeadline | None:
    """The deadline of the request this task serves (None outside a ttrpc handler)."""
    return _DEADLINE.get()


class TtrpcServer:
    """The registered services; `protocol()` makes the handler of one connection."""

    def __init__(self, services: Services, name: str = "ttrpc server") -> None:
        self.name = name
        self.services = {svc: dict(methods) for svc, methods in services.items()}

    def protocol(self) -> ServerConnection:
        return ServerConnection(self.services, self.name)


class ServerConnection(asyncio.Protocol):
    def __init__(self, services: Mapping[str, Mapping[str, Handler]], name: str) -> None:
        self._services = services
        self.name = name
        self._conn = Connection(Role.SERVER)
        self._transport: Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._conn.receive_data(data)
            for event in self._conn:
                self._dispatch(event)  # type: ignore[arg-type]  # a server gets requests only
        except TtrpcProtocolError as exc:
            log.error("%s: closing the connection: %s", self.name, exc)
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True  # handlers still running finish; their answers are dropped
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _dispatch(self, req: RequestReceived) -> None:
        handler = self._services.get(req.service, {}).get(req.method)
        if handler is None:
            self._answer(
                req.stream_id, GrpcCode.UNIMPLEMENTED, f"{req.service}/{req.method} is not implemented"
            )
        elif not req.unary:
            self._answer(
                req.stream_id,
                GrpcCode.UNIMPLEMENTED,
                f"{req.service}/{req.method}: streaming calls are not supported",
            )
        else:
            # A task per request: handlers of one connection run concurrently.
            loop = asyncio.get_running_loop()
            deadline = RequestDeadline(max(req.timeout_nano, 0) / 1e9, loop.time())
            task = loop.create_task(self._run(req, handler, deadline))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if req.timeout_nano > 0:
                timer = loop.call_later(req.timeout_nano / 1e9, self._expire, req, deadline)
                task.add_done_callback(lambda _: timer.cancel())

    async def _run(self, req: RequestReceived, handler: Handler, deadline: RequestDeadline) -> None:
        _DEADLINE.set(deadline)  # this task's context only
        code, message, payload = GrpcCode.OK, "", b""
        try:
            payload = await handler(req.payload)
        except NriCniError as exc:
            code = exc.grpc_code if exc.grpc_code != GrpcCode.OK else GrpcCode.UNKNOWN
            message = str(exc)
            log.error("%s: %s/%s failed: %s", self.name, req.service, req.method, message)
        except Exception as exc:
            log.error("%s: %s/%s raised", self.name, req.service, req.method, exc_info=exc)
            code, message = GrpcCode.UNKNOWN, f"{type(exc).__name__}: {exc}"
        if self._conn.is_open(req.stream_id):
            self._answer(req.stream_id, code, message, payload)
        else:
            log.warning(
                "%s: %s/%s finished after its deadline; answer dropped", self.name, req.service, req.method
            )

    def _expire(self, req: RequestReceived, deadline: RequestDeadline) -> None:
        deadline.expired = True
        message = f"{req.method}: no answer within {req.timeout_nano / 1e9:g}s"
        log.warning("%s: %s/%s: %s (the handler goes on)", self.name, req.service, req.method, message)
        self._answer(req.stream_id, GrpcCode.DEADLINE_EXCEEDED, message)

    def _answer(self, stream_id: int, code: int, message: str, payload: bytes = b"") -> None:
        if self._closing or self._transport is None:
            return
        self._transport.write(self._conn.send_response(stream_id, code, message, payload))
