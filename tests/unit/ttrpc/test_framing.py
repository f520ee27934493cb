"""ttrpc framing: round trips, every split point, every malformed header."""

from __future__ import annotations

import struct

import pytest

from nri_cni.errors import ProtocolError
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.framing import (
    FLAG_NO_DATA,
    FLAG_REMOTE_CLOSED,
    FLAG_REMOTE_OPEN,
    HEADER_SIZE,
    MAX_DATA,
    Frame,
    FrameDecoder,
    MessageType,
    encode_frame,
)

FRAMES = [
    Frame(1, MessageType.REQUEST, 0, b"request one"),
    Frame(1, MessageType.RESPONSE, 0, b""),
    Frame(3, MessageType.REQUEST, FLAG_REMOTE_OPEN, b"\x00\xff" * 7),
    Frame(3, MessageType.DATA, FLAG_REMOTE_CLOSED | FLAG_NO_DATA, b""),
    Frame(0xFFFFFFFF, MessageType.DATA, FLAG_REMOTE_CLOSED, b"x"),
]
STREAM = b"".join(encode_frame(f.stream_id, f.type, f.flags, f.data) for f in FRAMES)


def decode_chunks(*chunks: bytes) -> list[Frame]:
    decoder = FrameDecoder()
    out = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder)
    assert decoder.buffered == 0
    return out


def test_header_layout_is_big_endian_length_id_type_flags():
    assert encode_frame(0x01020304, MessageType.DATA, FLAG_REMOTE_CLOSED, b"ab") == (
        b"\x00\x00\x00\x02\x01\x02\x03\x04\x03\x01ab"
    )


def test_round_trip_all_in_one_read():
    assert decode_chunks(STREAM) == FRAMES


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_split_point(cut):
    assert decode_chunks(STREAM[:cut], STREAM[cut:]) == FRAMES


def test_byte_by_byte():
    assert decode_chunks(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == FRAMES


def test_incomplete_frame_is_kept_until_complete():
    decoder = FrameDecoder()
    frame = encode_frame(5, MessageType.REQUEST, 0, b"payload")
    decoder.feed(frame[: HEADER_SIZE + 3])
    assert list(decoder) == []
    assert decoder.buffered == HEADER_SIZE + 3
    decoder.feed(frame[HEADER_SIZE + 3 :])
    assert list(decoder) == [Frame(5, MessageType.REQUEST, 0, b"payload")]


def test_max_size_frame_is_accepted():
    data = bytes(range(256)) * (MAX_DATA // 256)
    assert len(data) == MAX_DATA
    [frame] = decode_chunks(encode_frame(7, MessageType.REQUEST, 0, data))
    assert frame.data == data


def test_encoding_oversize_data_is_refused():
    with pytest.raises(TtrpcProtocolError):
        encode_frame(1, MessageType.REQUEST, 0, b"\0" * (MAX_DATA + 1))


def header(length: int, stream_id: int, msg_type: int, flags: int) -> bytes:
    return struct.pack(">IIBB", length, stream_id, msg_type, flags)


MALFORMED = {
    "oversize length": header(MAX_DATA + 1, 1, 1, 0),
    "huge length (reserved first byte set)": header(0xFF000000, 1, 1, 0),
    "stream id 0": header(0, 0, 1, 0),
    "type 0": header(0, 1, 0, 0),
    "type 4": header(0, 1, 4, 0),
    "type 255": header(0, 1, 255, 0),
    "request flag 0x04": header(0, 1, 1, 0x04),
    "request flags remote-open and remote-closed": header(0, 1, 1, 0x03),
    "request flag 0x80": header(0, 1, 1, 0x80),
    "response flag 0x01": header(0, 1, 2, 0x01),
    "response flag 0x04": header(0, 1, 2, 0x04),
    "data flag 0x02": header(0, 1, 3, 0x02),
    "data flag 0x08": header(0, 1, 3, 0x08),
}


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_header_is_refused_without_waiting_for_data(raw):
    decoder = FrameDecoder()
    decoder.feed(raw)  # the header alone: an oversize frame's data never has to arrive
    with pytest.raises(TtrpcProtocolError) as info:
        list(decoder)
    assert isinstance(info.value, ProtocolError)
    # the decoder stays broken
    with pytest.raises(TtrpcProtocolError):
        decoder.feed(STREAM)
    with pytest.raises(TtrpcProtocolError):
        next(decoder)


def test_good_frames_before_a_bad_header_are_delivered():
    decoder = FrameDecoder()
    decoder.feed(STREAM + MALFORMED["type 4"])
    got = []
    with pytest.raises(TtrpcProtocolError):
        for frame in decoder:
            got.append(frame)
    assert got == FRAMES


def test_buffer_is_compacted_while_streaming():
    decoder = FrameDecoder()
    frame = encode_frame(1, MessageType.REQUEST, 0, b"z" * 1000)
    for _ in range(500):  # 500 kB through, never more than one frame plus a tail kept
        decoder.feed(frame + frame[:5])
        assert len(list(decoder)) == 1
        decoder.feed(frame[5:])
        assert len(list(decoder)) == 1
    assert len(decoder._in._buf) < 70_000  # the HeaderBuffer holds the bytes
