"""The daemon's local socket: how `nri-cni-shim` and the `nri-cni` CLI talk to `nri-cni run`.

Deliberately trivial, because the shim implements it with nothing but `_socket` (it is exec'd
for every CNI call and must start in a few ms). The framing is nri_cni/local/codec.py, shared by
the server, this client and the Python shim:

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

from nri_cni.errors import Unavailable
from nri_cni.local.codec import (
    MAX_BODY,
    MAX_HEADER,
    RESPONSE_HEAD,
    LocalProtocolError,
    body_length,
    decode_header,
    decode_response_head,
    encode_request,
    encode_response,
    header_length,
)

__all__ = [
    "MAX_BODY",
    "MAX_HEADER",
    "OP_KEY",
    "STATUS_ERROR",
    "STATUS_OK",
    "LocalProtocolError",
    "call",
    "decode_header",
    "encode_request",
    "encode_response",
    "read_request",
]

OP_KEY = "NRICNI_OP"
STATUS_OK = 0
STATUS_ERROR = 1


async def read_request(
    reader: asyncio.StreamReader, *, max_bytes: int = MAX_HEADER + MAX_BODY
) -> tuple[dict[str, str], bytes]:
    """One request; `max_bytes` caps header and body together (checked before reading them)."""
    try:
        hlen = header_length(await reader.readexactly(4))
        header = decode_header(await reader.readexactly(hlen))
        blen = body_length(await reader.readexactly(4))
        if hlen + blen > max_bytes:
            raise LocalProtocolError(f"request of {hlen + blen} bytes is over the {max_bytes} limit")
        body = await reader.readexactly(blen)
    except asyncio.IncompleteReadError as exc:
        raise LocalProtocolError("the request ended early") from exc
    return header, body


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
        sock.sendall(encode_request(list(header.items()), body))
        status, length = decode_response_head(_recv_exactly(sock, RESPONSE_HEAD))
        return status, _recv_exactly(sock, length)
    finally:
        sock.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise LocalProtocolError("the daemon closed the connection before answering")
        buf += chunk
    return bytes(buf)
