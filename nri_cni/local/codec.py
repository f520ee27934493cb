# The local socket's framing, without I/O: the one implementation the daemon's server, the CLI
# client (nri_cni/local/proto.py) and the Python shim share. The shim is a standalone script
# (`python -IS`, no package imports), so `nri-cni install-shim` copies this file's text into it
# (nri_cni/shim/__init__.py render): builtins only, no imports, annotations the running
# interpreter evaluates without any (builtin generics, no `X | Y`).
# The C shim (shim.c) is the one other implementation, tested against the same cases.
#
#     request  = u32 BE header length | header | u32 BE body length | body
#     header   = "KEY=VALUE" entries separated by NUL bytes
#     response = u8 status (0 ok, 1 error) | u32 BE length | payload

MAX_HEADER = 64 * 1024
MAX_BODY = 4 * 1024 * 1024
RESPONSE_HEAD = 5  # status byte and payload length


class LocalProtocolError(Exception):
    """A request or response that breaks the framing (or its limits)."""


def encode_request(pairs: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """pairs: the header's (key, value) strings; body: the request's body."""
    head = b"\0".join((k + "=" + v).encode() for k, v in pairs)
    return len(head).to_bytes(4, "big") + head + len(body).to_bytes(4, "big") + body


def header_length(raw: bytes) -> int:
    """The header's length from the request's first 4 bytes."""
    length = int.from_bytes(raw, "big")
    if length > MAX_HEADER:
        raise LocalProtocolError("header of %d bytes is over the %d limit" % (length, MAX_HEADER))
    return length


def body_length(raw: bytes) -> int:
    """The body's length from the 4 bytes after the header."""
    length = int.from_bytes(raw, "big")
    if length > MAX_BODY:
        raise LocalProtocolError("body of %d bytes is over the %d limit" % (length, MAX_BODY))
    return length


def decode_header(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw.split(b"\0") if raw else []:
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if not sep or not key:
            raise LocalProtocolError("malformed header entry %r" % item[:40])
        out[key] = value
    return out


def encode_response(status: int, payload: bytes) -> bytes:
    return bytes([status]) + len(payload).to_bytes(4, "big") + payload


def decode_response_head(raw: bytes) -> tuple[int, int]:
    """(status, payload length) from a response's first RESPONSE_HEAD bytes."""
    return raw[0], int.from_bytes(raw[1:RESPONSE_HEAD], "big")
