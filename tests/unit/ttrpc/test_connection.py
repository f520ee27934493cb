"""The ttrpc connection state machine in both roles."""

from __future__ import annotations

import pytest

from nri_cni.api import rpc_status_pb2, ttrpc_pb2
from nri_cni.errors import GrpcCode
from nri_cni.ttrpc.connection import Connection, RequestReceived, ResponseReceived, Role
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.framing import (
    FLAG_NO_DATA,
    FLAG_REMOTE_CLOSED,
    FLAG_REMOTE_OPEN,
    MAX_DATA,
    MessageType,
    encode_frame,
)


def feed(conn: Connection, data: bytes) -> list:
    conn.receive_data(data)
    return list(conn)


def raw_request(sid: int, flags: int = 0, **fields) -> bytes:
    req = ttrpc_pb2.Request(service=fields.pop("service", "svc"), method=fields.pop("method", "M"), **fields)
    return encode_frame(sid, MessageType.REQUEST, flags, req.SerializeToString())


def raw_response(sid: int, code: int = 0, message: str = "", payload: bytes = b"") -> bytes:
    resp = ttrpc_pb2.Response(status=rpc_status_pb2.Status(code=code, message=message), payload=payload)
    return encode_frame(sid, MessageType.RESPONSE, 0, resp.SerializeToString())


def test_request_and_response_round_trip():
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    sid, wire = client.send_request(
        "nri.Svc", "Do", b"\x01\x02", timeout_nano=2_000_000_000, metadata=[("k", "v"), ("k", "w")]
    )
    assert sid == 1
    [req] = feed(server, wire)
    assert req == RequestReceived(
        1, "nri.Svc", "Do", b"\x01\x02", 2_000_000_000, (("k", "v"), ("k", "w")), unary=True
    )
    assert server.pending == 1 and client.pending == 1
    [resp] = feed(client, server.send_response(1, GrpcCode.OK, "", b"answer"))
    assert resp == ResponseReceived(1, 0, "", b"answer")
    assert server.pending == 0 and client.pending == 0


def test_client_stream_ids_are_odd_and_increasing():
    client = Connection(Role.CLIENT)
    assert [client.send_request("s", "m", b"")[0] for _ in range(4)] == [1, 3, 5, 7]


def test_error_status_is_reported():
    client = Connection(Role.CLIENT)
    sid, _ = client.send_request("s", "m", b"")
    [resp] = feed(client, raw_response(sid, GrpcCode.NOT_FOUND, "gone"))
    assert (resp.code, resp.message) == (GrpcCode.NOT_FOUND, "gone")


def test_response_without_status_means_ok():
    client = Connection(Role.CLIENT)
    sid, _ = client.send_request("s", "m", b"")
    wire = encode_frame(sid, MessageType.RESPONSE, 0, ttrpc_pb2.Response(payload=b"p").SerializeToString())
    assert feed(client, wire) == [ResponseReceived(sid, 0, "", b"p")]


def test_forgotten_call_answer_is_dropped_quietly():
    client = Connection(Role.CLIENT)
    sid, _ = client.send_request("s", "m", b"")
    client.forget(sid)
    assert feed(client, raw_response(sid)) == []
    # and only once: a second answer on that stream is a protocol error
    with pytest.raises(TtrpcProtocolError):
        feed(client, raw_response(sid))


def test_streaming_request_is_reported_and_its_data_drained():
    server = Connection(Role.SERVER)
    [req] = feed(server, raw_request(1, FLAG_REMOTE_OPEN))
    assert not req.unary
    assert feed(server, encode_frame(1, MessageType.DATA, 0, b"chunk")) == []
    assert feed(server, encode_frame(1, MessageType.DATA, FLAG_REMOTE_CLOSED | FLAG_NO_DATA, b"")) == []
    with pytest.raises(TtrpcProtocolError, match="not sending"):
        feed(server, encode_frame(1, MessageType.DATA, 0, b"after close"))


def test_request_remote_closed_is_not_unary_and_sends_no_data():
    server = Connection(Role.SERVER)
    [req] = feed(server, raw_request(1, FLAG_REMOTE_CLOSED))
    assert not req.unary
    with pytest.raises(TtrpcProtocolError):
        feed(server, encode_frame(1, MessageType.DATA, 0, b"x"))


def test_oversize_response_becomes_resource_exhausted():
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    _, wire = client.send_request("s", "m", b"")
    feed(server, wire)
    [resp] = feed(client, server.send_response(1, payload=b"\0" * MAX_DATA))
    assert resp.code == GrpcCode.RESOURCE_EXHAUSTED and resp.payload == b""


SERVER_VIOLATIONS = {
    "even stream id": [raw_request(2)],
    "reused stream id": [raw_request(3), raw_request(3)],
    "decreasing stream id": [raw_request(5), raw_request(3)],
    "data on unknown stream": [encode_frame(1, MessageType.DATA, FLAG_REMOTE_CLOSED, b"")],
    "data on unary stream": [raw_request(1), encode_frame(1, MessageType.DATA, 0, b"x")],
    "response sent to server": [raw_response(1)],
    "truncated request protobuf": [encode_frame(1, MessageType.REQUEST, 0, raw_request(1)[10:-1])],
    "garbage request protobuf": [encode_frame(1, MessageType.REQUEST, 0, b"\xff\xff\xff")],
    "invalid utf-8 in service": [encode_frame(1, MessageType.REQUEST, 0, b"\x0a\x02\xc3\x28")],
}


@pytest.mark.parametrize("frames", SERVER_VIOLATIONS.values(), ids=SERVER_VIOLATIONS.keys())
def test_server_refuses(frames):
    server = Connection(Role.SERVER)
    with pytest.raises(TtrpcProtocolError):
        for frame in frames:
            feed(server, frame)
    with pytest.raises(TtrpcProtocolError):  # dead from now on
        feed(server, raw_request(101))


def client_violations(sid: int) -> dict[str, list[bytes]]:
    good = raw_response(sid)
    return {
        "response for unknown stream": [raw_response(sid + 2)],
        "second response": [good, good],
        "data frame": [encode_frame(sid, MessageType.DATA, 0, b"x")],
        "request frame": [raw_request(sid)],
        "truncated response protobuf": [encode_frame(sid, MessageType.RESPONSE, 0, good[10:-1])],
        "garbage response protobuf": [encode_frame(sid, MessageType.RESPONSE, 0, b"\x0a\xff")],
    }


@pytest.mark.parametrize("name", client_violations(1).keys())
def test_client_refuses(name):
    client = Connection(Role.CLIENT)
    sid, _ = client.send_request("s", "m", b"")
    with pytest.raises(TtrpcProtocolError):
        for frame in client_violations(sid)[name]:
            feed(client, frame)
    with pytest.raises(TtrpcProtocolError):
        client.send_request("s", "m", b"")


def test_roles_cannot_send_the_other_roles_messages():
    with pytest.raises(TtrpcProtocolError):
        Connection(Role.SERVER).send_request("s", "m", b"")
    with pytest.raises(TtrpcProtocolError):
        Connection(Role.CLIENT).send_response(1)
    with pytest.raises(TtrpcProtocolError, match="no request open"):
        Connection(Role.SERVER).send_response(1)


def test_events_split_across_reads():
    server = Connection(Role.SERVER)
    wire = raw_request(1, payload=b"a" * 100) + raw_request(3, payload=b"b")
    events = []
    for i in range(len(wire)):
        events += feed(server, wire[i : i + 1])
    assert [(e.stream_id, e.payload) for e in events] == [(1, b"a" * 100), (3, b"b")]
