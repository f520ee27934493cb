"""Two rtnetlink dumps (links, addresses) over a plain netlink socket, decoded by pyroute2.

pyroute2's `IPRoute` costs ~0.8 ms per netns here (an event loop per instance, every request
through asyncio) and its `netns=` argument forks a child per socket; a raw socket that a worker
opened inside the netns, with pyroute2's message classes for encoding and decoding, costs ~0.25 ms.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from functools import cache
from types import SimpleNamespace

from nri_cni.node.model import AddressState, LinkState, NetnsView

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10
RTM_GETLINK = 18
RTM_GETADDR = 22
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFA_F_PERMANENT = 0x80
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_DUMP_ATTEMPTS = 3  # the kernel marks a dump that raced a change; it is asked again
RECV_TIMEOUT = 2.0  # a netlink dump answers in microseconds; this only bounds a wedged kernel


class NetlinkError(OSError):
    pass


@cache
def _pyroute2() -> SimpleNamespace:
    # lazy: pyroute2's import costs ~155 ms, paid only by a daemon that verifies, never by the shim/CLI
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    return SimpleNamespace(ifinfmsg=ifinfmsg, ifaddrmsg=ifaddrmsg)


def preload() -> None:
    """Import pyroute2's message classes now (off the event loop, before the first round)."""
    _pyroute2()


def open_socket() -> socket.socket:
    """An rtnetlink socket in the calling thread's current netns (where it stays, whoever reads it)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        sock.settimeout(RECV_TIMEOUT)
    except BaseException:
        sock.close()
        raise
    return sock


def _dump(sock: socket.socket, msg_class: type, msg_type: int, seq: int) -> list:
    """Every message of one dump, decoded; asked again (a few times) when the kernel flags the
    dump as interrupted by a concurrent change."""
    for _ in range(_DUMP_ATTEMPTS):
        req = msg_class()
        req["header"]["type"] = msg_type
        req["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
        req["header"]["sequence_number"] = seq
        req.encode()
        sock.send(req.data)
        out, interrupted = _receive(sock, msg_class, seq)
        if not interrupted:
            return out
        seq += 1
    raise NetlinkError(errno.EAGAIN, f"netlink dump {msg_type} kept changing under us")


def _receive(sock: socket.socket, msg_class: type, seq: int) -> tuple[list, bool]:
    out: list = []
    interrupted = False
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, mtype, flags, mseq, _pid = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                raise NetlinkError(errno.EPROTO, "short netlink message")
            if mseq == seq:
                interrupted = interrupted or bool(flags & NLM_F_DUMP_INTR)
                if mtype == NLMSG_DONE:
                    return out, interrupted
                if mtype == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                    if code:
                        raise NetlinkError(-code, f"netlink: {errno.errorcode.get(-code, -code)}")
                    return out, interrupted
                msg = msg_class(data[offset : offset + length])
                msg.decode()
                out.append(msg)
            offset += (length + 3) & ~3


def read_view(sock: socket.socket, netns: str) -> NetnsView:
    """Links and addresses of the netns `sock` lives in."""
    pr = _pyroute2()
    view = NetnsView(netns=netns)
    for msg in _dump(sock, pr.ifinfmsg, RTM_GETLINK, 1):
        name = msg.get_attr("IFLA_IFNAME")
        flags = msg["flags"]
        view.links[name] = LinkState(
            index=msg["index"],
            name=name,
            mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(),
            up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
        )
    for msg in _dump(sock, pr.ifaddrmsg, RTM_GETADDR, 10):
        addr = msg.get_attr("IFA_ADDRESS")
        if addr is None:
            continue
        flags = msg.get_attr("IFA_FLAGS")
        flags = msg["flags"] if flags is None else flags
        view.addresses.setdefault(msg["index"], []).append(
            AddressState(
                address=ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}"),
                scope=msg["scope"],
                permanent=bool(flags & IFA_F_PERMANENT),
            )
        )
    return view


def link_names(sock: socket.socket) -> set[str]:
    """The names of every link of the netns `sock` lives in (the host's, for host-side checks)."""
    return {msg.get_attr("IFLA_IFNAME") for msg in _dump(sock, _pyroute2().ifinfmsg, RTM_GETLINK, 20)}
