"""The asyncio ttrpc client: concurrent unary calls over any Transport."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from nri_cni.errors import GrpcCode, RPCError, Unavailable
from nri_cni.ttrpc.connection import Connection, ResponseReceived, Role
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.transport import Transport

log = logging.getLogger(__name__)


class TtrpcClient(asyncio.Protocol):
    def __init__(self, name: str = "ttrpc client") -> None:
        self.name = name  # for log lines
        self._conn = Connection(Role.CLIENT)
        self._transport: Transport | None = None
        self._calls: dict[int, asyncio.Future[bytes]] = {}
        self._lost: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._conn.receive_data(data)
            for event in self._conn:
                assert isinstance(event, ResponseReceived)  # a client's connection yields no requests
                call = self._calls.pop(event.stream_id)
                if call.done():
                    continue
                if event.code == GrpcCode.OK:
                    call.set_result(event.payload)
                else:
                    call.set_exception(RPCError(event.code, event.message))
        except TtrpcProtocolError as exc:
            log.error("%s: closing the connection: %s", self.name, exc)
            self._fail_all(exc)
            if self._transport is not None:
                self._transport.close()

    def eof_received(self) -> bool:
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(exc or ConnectionResetError("connection closed"))
        if not self.closed.done():
            self.closed.set_result(None)

    # -- API -----------------------------------------------------------------------------------

    async def call(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        """Call service/method with a serialized request; returns the serialized answer.

        timeout (seconds) is sent as the request's deadline and enforced here too. Raises
        RPCError for a non-OK status (DEADLINE_EXCEEDED when the timeout passes first,
        RESOURCE_EXHAUSTED for a request too big for ttrpc) and Unavailable when there is no
        connection or it goes away during the call.
        """
        if self._transport is None or self._lost is not None:
            raise Unavailable(f"{self.name}: not connected", details=str(self._lost or ""))
        timeout_nano = int(timeout * 1e9) if timeout else 0
        try:
            sid, data = self._conn.send_request(
                service, method, payload, timeout_nano=timeout_nano, metadata=metadata
            )
        except TtrpcProtocolError as exc:  # nothing was sent; the connection is still good
            raise RPCError(GrpcCode.RESOURCE_EXHAUSTED, f"{service}/{method}: {exc}") from None
        call: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._calls[sid] = call
        self._transport.write(data)
        try:
            if not timeout:
                return await call
            async with asyncio.timeout(timeout):
                return await call
        except TimeoutError:
            raise RPCError(
                GrpcCode.DEADLINE_EXCEEDED, f"{service}/{method}: no answer within {timeout:g}s"
            ) from None
        finally:
            if self._calls.pop(sid, None) is not None:
                self._conn.forget(sid)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _fail_all(self, exc: BaseException) -> None:
        if self._lost is None:
            self._lost = exc
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if not call.done():
                call.set_exception(Unavailable(f"{self.name}: connection lost", details=str(exc)))
