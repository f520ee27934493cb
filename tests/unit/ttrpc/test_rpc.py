"""The asyncio ttrpc client and server over real sockets."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

import pytest

from nri_cni.api import ttrpc_pb2
from nri_cni.errors import ConfigError, GrpcCode, RPCError, Unavailable
from nri_cni.ttrpc import TtrpcClient, TtrpcServer
from nri_cni.ttrpc.connection import Connection, Role
from nri_cni.ttrpc.framing import FLAG_REMOTE_OPEN, MAX_DATA, MessageType, encode_frame

SVC = "test.Echo"


async def echo(payload: bytes) -> bytes:
    return payload


async def slow_echo(payload: bytes) -> bytes:
    await asyncio.sleep(int(payload) / 1000)
    return payload


HANGING: list[bytes] = []


async def hang(payload: bytes) -> bytes:
    """Records that it started, then never answers (on its own)."""
    HANGING.append(payload)
    await asyncio.sleep(60)
    return b""


STARTED: list[bytes] = []
FINISHED: list[bytes] = []


async def late(payload: bytes) -> bytes:
    """Records that it started, sleeps `payload` ms, then records that it finished."""
    STARTED.append(payload)
    await asyncio.sleep(int(payload) / 1000)
    FINISHED.append(payload)
    return payload


ARRIVED: list[bytes] = []


async def together(payload: bytes) -> bytes:
    """`COUNT:MS`: answers MS ms after COUNT calls have arrived (cleared by the test): a server
    that ran its handlers one at a time would never answer the first."""
    count, _, delay = payload.partition(b":")
    ARRIVED.append(payload)
    while len(ARRIVED) < int(count):
        await asyncio.sleep(0.005)
    await asyncio.sleep(int(delay) / 1000)
    return delay


async def until(predicate, timeout: float = 60.0) -> None:
    """Waits for an event the test caused; the deadline only fails a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the event did not come"
        await asyncio.sleep(0.005)


async def config_error(payload: bytes) -> bytes:
    raise ConfigError("bad network", location="/etc/cni/net.d/10-x.conflist")


async def value_error(payload: bytes) -> bytes:
    raise ValueError("boom")


async def own_timeout(payload: bytes) -> bytes:
    raise TimeoutError("the handler's own timeout")


async def big(payload: bytes) -> bytes:
    return b"\0" * int(payload)


SERVER = TtrpcServer(
    {
        SVC: {
            "Echo": echo,
            "Slow": slow_echo,
            "Hang": hang,
            "ConfigError": config_error,
            "ValueError": value_error,
            "OwnTimeout": own_timeout,
            "Big": big,
            "Late": late,
            "Together": together,
        }
    }
)


async def pair(server: TtrpcServer = SERVER):
    """A client and a server connection over a socketpair."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    conn = server.protocol()
    await loop.connect_accepted_socket(lambda: conn, a)
    client = TtrpcClient()
    await loop.create_unix_connection(lambda: client, sock=b)
    return client, conn


async def raw_pair(server: TtrpcServer = SERVER):
    """A server connection and the raw stream talking to it."""
    a, b = socket.socketpair()
    conn = server.protocol()
    await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, a)
    reader, writer = await asyncio.open_unix_connection(sock=b)
    return reader, writer, conn


async def read_response(reader: asyncio.StreamReader) -> tuple[int, ttrpc_pb2.Response]:
    header = await reader.readexactly(10)
    length, sid, kind, flags = struct.unpack(">IIBB", header)
    assert (kind, flags) == (MessageType.RESPONSE, 0)
    return sid, ttrpc_pb2.Response.FromString(await reader.readexactly(length))


def test_echo(arun):
    async def main():
        client, _ = await pair()
        assert await client.call(SVC, "Echo", b"hello") == b"hello"
        assert await client.call(SVC, "Echo", b"") == b""
        client.close()
        await client.closed

    arun(main())


def test_concurrent_calls_are_matched_and_run_in_parallel(arun):
    async def main():
        client, _ = await pair()
        delays = [(i * 37) % 100 for i in range(60)]  # 0..99 ms, shuffled: answers come out of order
        ARRIVED.clear()
        # every handler waits until all 60 calls have arrived: served one at a time, none answers
        got = await asyncio.gather(*(client.call(SVC, "Together", b"60:%d" % d) for d in delays))
        assert got == [str(d).encode() for d in delays]
        client.close()

    arun(main(), timeout=60)


def test_big_payloads_round_trip(arun):
    async def main():
        client, _ = await pair()
        data = bytes(range(256)) * (3 * 1024 * 1024 // 256)
        assert await client.call(SVC, "Echo", data) == data
        assert len(await client.call(SVC, "Big", str(MAX_DATA - 100).encode())) == MAX_DATA - 100
        with pytest.raises(RPCError) as info:
            await client.call(SVC, "Big", str(MAX_DATA).encode())
        assert info.value.code == GrpcCode.RESOURCE_EXHAUSTED
        with pytest.raises(RPCError) as info:
            await client.call(SVC, "Echo", b"\0" * MAX_DATA)
        assert info.value.code == GrpcCode.RESOURCE_EXHAUSTED
        assert await client.call(SVC, "Echo", b"still fine") == b"still fine"
        client.close()

    arun(main())


@pytest.mark.parametrize("service, method", [(SVC, "Nope"), ("test.Nope", "Echo")])
def test_unimplemented(arun, service, method):
    async def main():
        client, _ = await pair()
        with pytest.raises(RPCError) as info:
            await client.call(service, method, b"")
        assert info.value.code == GrpcCode.UNIMPLEMENTED == 12
        assert method in info.value.msg
        client.close()

    arun(main())


def test_nri_cni_error_becomes_its_grpc_code(arun, caplog):
    async def main():
        client, _ = await pair()
        with pytest.raises(RPCError) as info:
            await client.call(SVC, "ConfigError", b"")
        assert info.value.code == GrpcCode.INVALID_ARGUMENT
        assert info.value.msg == "/etc/cni/net.d/10-x.conflist: bad network"
        client.close()

    arun(main())
    assert "bad network" in caplog.text


def test_other_exception_becomes_unknown_and_is_logged(arun, caplog):
    async def main():
        client, _ = await pair()
        for method in ("ValueError", "OwnTimeout"):
            with pytest.raises(RPCError) as info:
                await client.call(SVC, method, b"", timeout=5)
            assert info.value.code == GrpcCode.UNKNOWN
        assert await client.call(SVC, "Echo", b"x") == b"x"
        client.close()

    with caplog.at_level(logging.ERROR, logger="nri_cni.ttrpc.server"):
        arun(main())
    assert "ValueError: boom" in caplog.text and "Traceback" in caplog.text
    assert "TimeoutError: the handler's own timeout" in caplog.text


def test_client_timeout_and_late_answer_dropped(arun):
    async def main():
        client, _ = await pair()
        # the handler answers after 2 s: a call that waited for it would not raise
        with pytest.raises(RPCError) as info:
            await client.call(SVC, "Late", b"2001", timeout=0.05)
        assert info.value.code == GrpcCode.DEADLINE_EXCEEDED
        assert b"2001" not in FINISHED
        await until(lambda: b"2001" in FINISHED)  # the late answer is sent (before the next one)
        assert await client.call(SVC, "Echo", b"after") == b"after"  # the late one was dropped
        client.close()

    arun(main(), timeout=60)


def test_server_answers_deadline_exceeded_and_lets_the_handler_finish(arun, caplog):
    async def main():
        reader, writer, _ = await raw_pair()
        conn = Connection(Role.CLIENT)
        # the handler takes 2 s; the request's deadline is 50 ms
        sid, data = conn.send_request(SVC, "Late", b"2000", timeout_nano=50_000_000)
        writer.write(data)
        got_sid, resp = await read_response(reader)
        assert got_sid == sid
        assert resp.status.code == GrpcCode.DEADLINE_EXCEEDED
        assert b"2000" not in FINISHED  # answered at the deadline, not when the handler ended
        # the connection goes on; the late handler finishes and its answer is dropped
        sid2, data = conn.send_request(SVC, "Echo", b"next")
        writer.write(data)
        got_sid, resp = await read_response(reader)
        assert (got_sid, resp.status.code, resp.payload) == (sid2, 0, b"next")
        await until(lambda: b"2000" in FINISHED)  # the handler was let finish
        writer.write(conn.send_request(SVC, "Echo", b"last")[1])
        sid3, resp = await read_response(reader)  # nothing from stream 1 came in between
        assert (sid3, resp.payload) == (5, b"last")
        writer.close()

    with caplog.at_level(logging.WARNING):
        arun(main(), timeout=60)
    assert "answer dropped" in caplog.text


def test_handlers_finish_after_the_connection_is_gone(arun):
    async def main():
        client, server_conn = await pair()
        pending = asyncio.ensure_future(client.call(SVC, "Late", b"200"))
        await until(lambda: b"200" in STARTED)
        client.close()
        with pytest.raises(Unavailable):
            await pending
        await server_conn.closed
        await until(lambda: b"200" in FINISHED)

    arun(main())


def test_streaming_request_is_answered_unimplemented(arun):
    async def main():
        reader, writer, _ = await raw_pair()
        req = ttrpc_pb2.Request(service=SVC, method="Echo").SerializeToString()
        writer.write(
            encode_frame(1, MessageType.REQUEST, FLAG_REMOTE_OPEN, req)
            + encode_frame(1, MessageType.DATA, 1, b"the stream's data")
        )
        sid, resp = await read_response(reader)
        assert (sid, resp.status.code) == (1, GrpcCode.UNIMPLEMENTED)
        # the connection is still good
        writer.write(
            encode_frame(
                3,
                MessageType.REQUEST,
                0,
                ttrpc_pb2.Request(service=SVC, method="Echo", payload=b"ok").SerializeToString(),
            )
        )
        sid, resp = await read_response(reader)
        assert (sid, resp.status.code, resp.payload) == (3, 0, b"ok")
        writer.close()

    arun(main())


MALFORMED = {
    "oversize length": struct.pack(">IIBB", MAX_DATA + 1, 1, 1, 0),
    "unknown type": struct.pack(">IIBB", 0, 1, 9, 0),
    "even stream id": encode_frame(2, MessageType.REQUEST, 0, b""),
    "garbage request": encode_frame(1, MessageType.REQUEST, 0, b"\xff\xff"),
}


@pytest.mark.parametrize("garbage", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frame_closes_connection_and_server_keeps_serving(arun, sock_dir, caplog, garbage):
    async def main():
        path = str(sock_dir / "ttrpc.sock")
        listener = await asyncio.get_running_loop().create_unix_server(SERVER.protocol, path)
        try:
            # a call in flight on the connection that goes bad is cancelled with it
            bad = TtrpcClient()
            transport, _ = await asyncio.get_running_loop().create_unix_connection(lambda: bad, path)
            hanging = len(HANGING)
            pending = asyncio.ensure_future(bad.call(SVC, "Hang", b""))
            await until(lambda: len(HANGING) > hanging)  # in flight: its handler runs
            transport.write(garbage)
            with pytest.raises(Unavailable):
                await pending
            await bad.closed
            # the listener still serves new connections
            good = TtrpcClient()
            await asyncio.get_running_loop().create_unix_connection(lambda: good, path)
            assert await good.call(SVC, "Echo", b"alive") == b"alive"
            good.close()
        finally:
            listener.close()
            await listener.wait_closed()

    with caplog.at_level(logging.ERROR):
        arun(main())
    assert "closing the connection" in caplog.text


def test_connection_lost_fails_calls_in_flight_and_later_calls(arun):
    async def main():
        client, server_conn = await pair()
        hanging = len(HANGING)
        pending = asyncio.ensure_future(client.call(SVC, "Hang", b""))
        await until(lambda: len(HANGING) > hanging)  # in flight: its handler runs
        server_conn.close()
        with pytest.raises(Unavailable):
            await pending
        await client.closed
        with pytest.raises(Unavailable):
            await client.call(SVC, "Echo", b"")

    arun(main())


def test_client_closes_on_malformed_answer(arun, caplog):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        client = TtrpcClient()
        await loop.create_unix_connection(lambda: client, sock=b)
        reader, writer = await asyncio.open_unix_connection(sock=a)
        pending = asyncio.ensure_future(client.call(SVC, "Echo", b""))
        length = struct.unpack(">I", (await reader.readexactly(10))[:4])[0]
        await reader.readexactly(length)
        writer.write(encode_frame(99, MessageType.RESPONSE, 0, b""))  # no call on stream 99
        with pytest.raises(Unavailable):
            await pending
        await client.closed
        assert await reader.read() == b""  # the client hung up
        writer.close()

    arun(main())
    assert "response on stream 99" in caplog.text


def test_call_without_connection_is_unavailable(arun):
    async def main():
        with pytest.raises(Unavailable):
            await TtrpcClient().call(SVC, "Echo", b"")

    arun(main())
