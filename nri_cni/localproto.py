"""The daemon's local socket: how `nri-cni-shim` and the `nri-cni` CLI talk to `nri-cni run`.

Deliberately trivial, because the shim implements it by hand with nothing but `_socket` (it is
exec'd for every CNI call and must start in a few ms):

    request  = u32 BE header length | header | u32 BE body length | body
    header   = "KEY=VALUE" entries separated by NUL bytes: the shim's CNI_* environment, or
               NRICNI_OP=<status|pods|gc> for the CLI
    body     = the shim's stdin (the network config), or empty
    response = u8 status (0 ok, 1 error) | u32 BE length | payload

For a CNI call the payload is exactly what the shim prints on stdout (a result, or a CNI error
object), and the status its exit code. For the CLI the payload is JSON.
One request per connection.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from nri_cni.errors import Unavailable

MAX_HEADER = 64 * 1024
MAX_BODY = 4 * 1024 * 1024
OP_KEY = "NRICNI_OP"
STATUS_OK = 0
STATUS_ERROR = 1


class LocalProtocolError(Exception):
    pass


def encode_request(header: dict[str, str], body: bytes = b"") -> bytes:
    head = b"\0".join(f"{k}={v}".encode() for k, v in header.items())
    return struct.pack(">I", len(head)) + head + struct.pack(">I", len(body)) + body


def decode_header(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw.split(b"\0") if raw else []:
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if not sep or not key:
            raise LocalProtocolError(f"malformed header entry {item[:40]!r}")
        out[key] = value
    return out


async def read_request(
    reader: asyncio.StreamReader, *, max_bytes: int = MAX_HEADER + MAX_BODY
) -> tuple[dict[str, str], bytes]:
    """One request; `max_bytes` caps header and body together (checked before reading them)."""
    try:
        (hlen,) = struct.unpack(">I", await reader.readexactly(4))
        if hlen > MAX_HEADER:
            raise LocalProtocolError(f"header of {hlen} bytes is over the {MAX_HEADER} limit")
        header = decode_header(await reader.readexactly(hlen))
        (blen,) = struct.unpack(">I", await reader.readexactly(4))
        if blen > MAX_BODY:
            raise LocalProtocolError(f"body of {blen} bytes is over the {MAX_BODY} limit")
        if hlen + blen > max_bytes:
            raise LocalProtocolError(f"request of {hlen + blen} bytes is over the {max_bytes} limit")
        body = await reader.readexactly(blen)
    except asyncio.IncompleteReadError as exc:
        raise LocalProtocolError("the request ended early") from exc
    return header, body


def encode_response(status: int, payload: bytes) -> bytes:
    return struct.pack(">BI", status, len(payload)) + payload


def call(
    socket_path: str, header: dict[str, str], body: bytes = b"", timeout: float = 300.0
) -> tuple[int, bytes]:
    """Blocking client for the CLI: one request, one response."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise Unavailable(
                f"the nri-cni daemon is not reachable at {socket_path}: "
                f"{exc.strerror or exc} (is `nri-cni run` running?)"
            ) from exc
        sock.sendall(encode_request(header, body))
        head = _recv_exactly(sock, 5)
        status, length = struct.unpack(">BI", head)
        return status, _recv_exactly(sock, length)
    finally:
        sock.close()


def _recv_exactly(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise LocalProtocolError("the daemon closed the connection before answering")
        buf += chunk
    return bytes(buf)
