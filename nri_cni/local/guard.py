"""Who is on the other end of a local socket, and how much one connection may take.

The daemon's local socket starts pod networking as root, so its mode (0600, in a directory
created under a 077 umask) is the first gate and SO_PEERCRED the second: the kernel's record of
the connecting process's uid and gid, which no client can forge. Root is allowed by default;
`daemon.allowed_uids` / `daemon.allowed_gids` add others (they also need the socket's mode to let
them connect: docs/security.md).

`LocalGuard` holds the per-server limits: a connection cap (a client past it is closed at once,
so idle connections cannot exhaust the daemon's descriptors), a read timeout for the whole
request (a half-sent request no longer keeps a connection forever), and a request size cap.
Refusals are logged at most once per `LOG_EVERY` seconds with a count of those not logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from nri_cni.local import proto
from nri_cni.safety.ratelog import RateLimitedLog

log = logging.getLogger("nri_cni.local")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket | None) -> Peer | None:
    """The connecting process's credentials (Linux SO_PEERCRED); None when unavailable."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid, uid, gid)


def peer_allowed(peer: Peer | None, uids: tuple[int, ...], gids: tuple[int, ...]) -> bool:
    return peer is not None and (peer.uid in uids or peer.gid in gids)


def grant_socket(path: str, gids: tuple[int, ...]) -> None:
    """The socket 0600 root's; with allowed gids, 0660 for the first of them (and its
    directory searchable by that group): the mode is the first gate, SO_PEERCRED the second."""
    if not gids:
        os.chmod(path, 0o600)
        return
    os.chown(path, -1, gids[0])
    os.chmod(path, 0o660)
    directory = os.path.dirname(path) or "."
    os.chown(directory, -1, gids[0])
    os.chmod(directory, 0o710)


@dataclass(frozen=True)
class GuardSettings:
    allowed_uids: tuple[int, ...] = (0,)
    allowed_gids: tuple[int, ...] = ()
    max_connections: int = 128
    read_timeout: float = 10.0
    max_request_bytes: int = proto.MAX_HEADER + proto.MAX_BODY


class LocalGuard:
    """Admission (peer credentials, connection cap) and bounded reading for one local server.
    `settings` is asked on every connection, so a reloaded config applies at once."""

    def __init__(self, settings: Callable[[], GuardSettings]) -> None:
        self.settings = settings
        self.open = 0
        self.refusals = RateLimitedLog(log)

    def admit(self, writer: asyncio.StreamWriter) -> bool:
        """True when this connection may be served; the caller then release()s it once."""
        s = self.settings()
        if self.open >= s.max_connections:
            self.refusals("cap", "local socket: over %d connections; one refused", s.max_connections)
            return False
        peer = peer_of(writer.get_extra_info("socket"))
        if not peer_allowed(peer, s.allowed_uids, s.allowed_gids):
            who = f"uid {peer.uid} gid {peer.gid} pid {peer.pid}" if peer else "an unknown peer"
            self.refusals("peer", "local socket: %s is not allowed (daemon.allowed_uids/gids)", who)
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    async def read(self, reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes]:
        """One request within the read timeout and size cap; raises LocalProtocolError."""
        s = self.settings()
        try:
            # a timeout scope, not wait_for: no task of its own, the read starts in this turn
            async with asyncio.timeout(s.read_timeout or None):
                return await proto.read_request(reader, max_bytes=s.max_request_bytes)
        except TimeoutError:
            raise proto.LocalProtocolError(
                f"no whole request within {s.read_timeout:g}s (daemon.read_timeout)"
            ) from None
