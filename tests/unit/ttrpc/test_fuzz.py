"""Property: whatever bytes arrive, the decoders raise nothing but their protocol error."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.api import ttrpc_pb2
from nri_cni.nri import mux
from nri_cni.ttrpc.connection import Connection, Role
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.framing import FrameDecoder

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Plausible protobuf bodies (whole and cut short) as well as noise, so that decoding gets past
# the frame headers.
messages = st.one_of(
    st.builds(
        lambda s, m, p, t: ttrpc_pb2.Request(
            service=s, method=m, payload=p, timeout_nano=t
        ).SerializeToString(),
        st.text(max_size=8),
        st.text(max_size=8),
        st.binary(max_size=16),
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.builds(
        lambda c, m, p: ttrpc_pb2.Response(payload=p, status={"code": c, "message": m}).SerializeToString(),
        st.integers(-(2**31), 2**31 - 1),
        st.text(max_size=8),
        st.binary(max_size=16),
    ),
)
payloads = st.one_of(st.binary(max_size=64), messages, messages.filter(len).map(lambda body: body[:-1]))
# Headers near the valid ones (client stream ids, known types, defined flags) more often than
# not, so that most frames get as far as the stream bookkeeping and the protobuf decoding.
frames = st.builds(
    lambda sid, kind, flags, body: struct.pack(">IIBB", len(body), sid, kind, flags) + body,
    st.one_of(st.sampled_from([1, 3, 5, 7]), st.integers(0, 9)),
    st.one_of(st.sampled_from([1, 2]), st.integers(0, 4)),
    st.one_of(st.just(0), st.sampled_from([1, 2, 4, 5]), st.integers(0, 255)),
    payloads,
)
ttrpc_streams = st.one_of(
    st.binary(max_size=200),
    st.lists(frames, max_size=8).map(b"".join),
)
splits = st.lists(st.integers(0, 400), max_size=6)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])] or [b""]


@SETTINGS
@given(ttrpc_streams, splits)
def test_frame_decoder(data, cuts):
    decoder = FrameDecoder()
    try:
        for chunk in chunks(data, cuts):
            decoder.feed(chunk)
            list(decoder)
    except TtrpcProtocolError:
        pass


@SETTINGS
@given(ttrpc_streams, splits, st.integers(0, 4))
def test_client_connection(data, cuts, calls):
    conn = Connection(Role.CLIENT)
    for _ in range(calls):  # calls in flight on streams 1, 3, 5, 7, so responses can match
        conn.send_request("svc", "m", b"")
    conn.forget(1)
    try:
        for chunk in chunks(data, cuts):
            conn.receive_data(chunk)
            list(conn)
    except TtrpcProtocolError:
        pass


@SETTINGS
@given(ttrpc_streams, splits)
def test_server_connection(data, cuts):
    conn = Connection(Role.SERVER)
    try:
        for chunk in chunks(data, cuts):
            conn.receive_data(chunk)
            for event in conn:
                conn.send_response(event.stream_id, 0, "", event.payload)
    except TtrpcProtocolError:
        pass


mux_chunks = st.builds(
    lambda cid, body: struct.pack(">II", cid, len(body)) + body, st.integers(0, 3), ttrpc_streams
)
mux_streams = st.one_of(st.binary(max_size=200), st.lists(mux_chunks, max_size=6).map(b"".join))


@SETTINGS
@given(mux_streams, splits)
def test_mux_decoder_and_the_connections_behind_it(data, cuts):
    decoder = mux.MuxDecoder((1, 2))
    behind = {1: Connection(Role.SERVER), 2: Connection(Role.CLIENT)}
    behind[2].send_request("svc", "m", b"")
    try:
        for chunk in chunks(data, cuts):
            decoder.feed(chunk)
            for conn_id, payload in decoder:
                try:
                    behind[conn_id].receive_data(payload)
                    list(behind[conn_id])
                except TtrpcProtocolError:
                    behind[conn_id] = Connection(behind[conn_id].role)
    except mux.MuxProtocolError:
        pass
