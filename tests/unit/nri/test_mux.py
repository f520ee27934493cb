"""The NRI multiplexer codec: round trips, splits, chunking, malformed input, unknown ids."""

from __future__ import annotations

import struct

import pytest

from nri_cni.errors import ProtocolError
from nri_cni.nri import mux

STREAM = (
    mux.encode(1, b"to the plugin")
    + mux.encode(2, b"to the runtime")
    + mux.encode(1, b"\x00" * 300)
    + mux.encode(2, b"last")
)
EXPECTED = [(1, b"to the plugin"), (2, b"to the runtime"), (1, b"\x00" * 300), (2, b"last")]


def decode(*chunks: bytes, ids=(1, 2)) -> list[tuple[int, bytes]]:
    decoder = mux.MuxDecoder(ids)
    out = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder)
    return out


def test_header_is_conn_id_then_length_big_endian():
    assert mux.encode(2, b"abc") == b"\x00\x00\x00\x02\x00\x00\x00\x03abc"


def test_round_trip():
    assert decode(STREAM) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_split_point(cut):
    assert decode(STREAM[:cut], STREAM[cut:]) == EXPECTED


def test_byte_by_byte():
    assert decode(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == EXPECTED


def test_large_writes_are_chunked_like_the_go_mux():
    data = bytes(range(256)) * ((mux.MAX_PAYLOAD * 2 + 1000) // 256)
    wire = mux.encode(1, data)
    chunks = decode(wire)
    assert [len(c) for _, c in chunks] == [mux.MAX_PAYLOAD, mux.MAX_PAYLOAD, len(data) - 2 * mux.MAX_PAYLOAD]
    assert b"".join(c for _, c in chunks) == data


def test_max_payload_is_one_chunk():
    data = b"\1" * mux.MAX_PAYLOAD
    assert decode(mux.encode(2, data)) == [(2, data)]


def test_unknown_and_reserved_ids_and_empty_chunks_are_dropped():
    wire = (
        mux.encode(0, b"reserved")
        + mux.encode(7, b"unknown")
        + mux.encode(1, b"")
        + mux.encode(2, b"kept")
        + mux.encode(0xFFFFFFFF, b"x")
    )
    assert decode(wire) == [(2, b"kept")]
    assert decode(wire, ids=(0, 7)) == [(7, b"unknown")]  # 0 stays reserved


def test_oversize_chunk_is_refused_before_its_data():
    decoder = mux.MuxDecoder((1, 2))
    decoder.feed(mux.encode(1, b"fine") + struct.pack(">II", 1, mux.MAX_PAYLOAD + 1))
    got = []
    with pytest.raises(mux.MuxProtocolError) as info:
        for item in decoder:
            got.append(item)
    assert got == [(1, b"fine")]
    assert isinstance(info.value, ProtocolError)
    with pytest.raises(mux.MuxProtocolError):
        decoder.feed(b"more")
    with pytest.raises(mux.MuxProtocolError):
        next(decoder)


def test_oversize_chunk_for_an_unknown_id_is_refused_too():
    with pytest.raises(mux.MuxProtocolError):
        decode(struct.pack(">II", 9, 0xFFFFFFFF))
