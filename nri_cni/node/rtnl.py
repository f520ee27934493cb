"""rtnetlink requests over a plain netlink socket, encoded and decoded here with struct.

Per netns: one RTM_GETLINK per expected interface (a GET by name, without statistics: the kernel
sends that link only) and one address dump filtered by the kernel to that link. pyroute2's
`IPRoute` costs ~0.8 ms per netns here (an event loop per instance, every request through asyncio)
and its `netns=` argument forks a child per socket. Its message classes decode the same answers
correctly but importing them costs ~155 ms and ~10 MiB of the daemon's memory for the life of the
process: the few fields verify reads (name, MAC, flags, master, kind; address, prefix, scope,
flags) are decoded here instead, checked against pyroute2's encoding in tests/node.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from nri_cni.node.model import AddressState, HostLink, LinkState, NetnsView, RouteState

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10
RTM_GETLINK = 18
RTM_GETADDR = 22
RTM_GETROUTE = 26
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFA_F_PERMANENT = 0x80
IFA_F_DADFAILED = 0x08
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12  # the kernel filters dumps by the request's fields (Linux 4.20)
RTEXT_FILTER_SKIP_STATS = 1 << 3  # no IFLA_STATS/STATS64 in link messages: nothing to decode
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_DUMP_ATTEMPTS = 3  # the kernel marks a dump that raced a change; it is asked again
RECV_TIMEOUT = 2.0  # a netlink dump answers in microseconds; this only bounds a wedged kernel


class NetlinkError(OSError):
    pass


def open_socket() -> socket.socket:
    """An rtnetlink socket in the calling thread's current netns (where it stays, whoever reads it)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        sock.settimeout(RECV_TIMEOUT)
        try:
            sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        except OSError:  # an older kernel: it dumps everything and read_view filters
            pass
    except BaseException:
        sock.close()
        raise
    return sock


IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MASTER = 10
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_EXT_MASK = 29
IFA_ADDRESS = 1
IFA_FLAGS = 8
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_TABLE = 15
_NLA = struct.Struct("=HH")  # nlattr: length, type
_U32 = struct.Struct("=I")
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
_LEN_OFFSET = 0  # nlmsghdr.nlmsg_len
_SEQ_OFFSET = 8  # nlmsghdr.nlmsg_seq
_IFA_INDEX_OFFSET = _HEADER.size + 4  # ifaddrmsg: family, prefixlen, flags, scope (u8 each), index


def _attr(kind: int, value: bytes) -> bytes:
    return _NLA.pack(_NLA.size + len(value), kind) + value + bytes(-len(value) % 4)


def _template(msg_type: int, flags: int, body: bytes) -> bytes:
    """A request: the header (its length and sequence number patched by `_request`), the body."""
    return _HEADER.pack(_HEADER.size + len(body), msg_type, flags, 0, 0) + body


# the two requests a round sends, made once: a link GET without statistics, an address dump
GETLINK = _template(
    RTM_GETLINK,
    NLM_F_REQUEST,
    _IFINFO.pack(0, 0, 0, 0, 0) + _attr(IFLA_EXT_MASK, _U32.pack(RTEXT_FILTER_SKIP_STATS)),
)
GETADDR_DUMP = _template(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, _IFADDR.pack(0, 0, 0, 0, 0))
# routes of both families: every table, or (strict checking) the main table's through one link
GETROUTE_DUMP = _template(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, _RTMSG.pack(0, 0, 0, 0, 0, 0, 0, 0, 0))
RT_TABLE_MAIN = 254
GETROUTE_MAIN_DUMP = _template(
    RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, _RTMSG.pack(0, 0, 0, 0, RT_TABLE_MAIN, 0, 0, 0, 0)
)


def _request(template: bytes, seq: int, *, ifa_index: int | None = None, ifname: str | None = None) -> bytes:
    buf = bytearray(template)
    if ifname is not None:  # an IFLA_IFNAME attribute: NUL-terminated, padded to 4 bytes
        buf += _attr(IFLA_IFNAME, ifname.encode() + b"\0")
        struct.pack_into("=I", buf, _LEN_OFFSET, len(buf))
    struct.pack_into("=I", buf, _SEQ_OFFSET, seq)
    if ifa_index is not None:
        struct.pack_into("=I", buf, _IFA_INDEX_OFFSET, ifa_index)
    return bytes(buf)


def attributes(data: bytes | memoryview, offset: int, end: int) -> Iterator[tuple[int, memoryview]]:
    """(type, value) of each rtattr in data[offset:end]."""
    view = memoryview(data)
    while offset + _NLA.size <= end:
        length, kind = _NLA.unpack_from(view, offset)
        if length < _NLA.size or offset + length > end:
            return  # malformed: what follows cannot be trusted
        yield kind & _NLA_TYPE_MASK, view[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3


def _string(value: memoryview) -> str:
    return bytes(value).split(b"\0", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class Link:
    """What verify reads of an RTM_NEWLINK message."""

    index: int
    flags: int
    name: str = ""
    mac: str = ""
    master: int | None = None
    kind: str = ""


@dataclass(frozen=True)
class Address:
    """What verify reads of an RTM_NEWADDR message."""

    index: int
    prefixlen: int
    scope: int
    flags: int  # IFA_FLAGS when present (32 bits), else the header's 8
    address: str = ""


def decode_link(msg: memoryview) -> Link:
    """One RTM_NEWLINK message (header included)."""
    _family, _type, index, flags, _change = _IFINFO.unpack_from(msg, _HEADER.size)
    name = mac = kind = ""
    master = None
    for kind_, value in attributes(msg, _HEADER.size + _IFINFO.size, len(msg)):
        if kind_ == IFLA_IFNAME:
            name = _string(value)
        elif kind_ == IFLA_ADDRESS:
            mac = ":".join(f"{b:02x}" for b in bytes(value))
        elif kind_ == IFLA_MASTER and len(value) >= 4:
            master = _U32.unpack_from(value)[0]
        elif kind_ == IFLA_LINKINFO:
            for sub, inner in attributes(value, 0, len(value)):
                if sub == IFLA_INFO_KIND:
                    kind = _string(inner)
    return Link(index, flags, name, mac, master, kind)


def decode_address(msg: memoryview) -> Address:
    """One RTM_NEWADDR message (header included)."""
    family, prefixlen, flags, scope, index = _IFADDR.unpack_from(msg, _HEADER.size)
    address = ""
    for kind, value in attributes(msg, _HEADER.size + _IFADDR.size, len(msg)):
        if kind == IFA_ADDRESS:
            address = str(ipaddress.ip_address(bytes(value))) if len(value) in (4, 16) else ""
        elif kind == IFA_FLAGS and len(value) >= 4:
            flags = _U32.unpack_from(value)[0]
    return Address(index, prefixlen, scope, flags, address)


def decode_route(msg: memoryview) -> RouteState | None:
    """One RTM_NEWROUTE message (header included); None for one without a family verify knows."""
    family, dst_len, _src, _tos, table, _proto, _scope, _type, _flags = _RTMSG.unpack_from(msg, _HEADER.size)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    dst: bytes = bytes(4 if family == socket.AF_INET else 16)
    gw = None
    oif = None
    for kind, value in attributes(msg, _HEADER.size + _RTMSG.size, len(msg)):
        if kind == RTA_DST:
            dst = bytes(value)
        elif kind == RTA_GATEWAY and len(value) in (4, 16):
            gw = ipaddress.ip_address(bytes(value))
        elif kind == RTA_OIF and len(value) >= 4:
            oif = _U32.unpack_from(value)[0]
        elif kind == RTA_TABLE and len(value) >= 4:
            table = _U32.unpack_from(value)[0]
    if len(dst) not in (4, 16):
        return None
    network = ipaddress.ip_network(f"{ipaddress.ip_address(dst)}/{dst_len}", strict=False)
    return RouteState(dst=network, gw=gw, oif=oif, table=table)


def _dump(sock: socket.socket, seq: int, *, ifa_index: int) -> list[Address]:
    """Every address of one dump; asked again (a few times) when the kernel flags the dump as
    interrupted by a concurrent change."""
    for _ in range(_DUMP_ATTEMPTS):
        sock.send(_request(GETADDR_DUMP, seq, ifa_index=ifa_index))
        out, interrupted = _receive(sock, seq)
        if not interrupted:
            return [decode_address(m) for m in out]
        seq += 1
    raise NetlinkError(errno.EAGAIN, f"netlink dump {RTM_GETADDR} kept changing under us")


def _route_request(seq: int, oif: int | None) -> bytes:
    """The route dump request: every route (oif None), or the main table's through `oif`."""
    if oif is None:
        return _request(GETROUTE_DUMP, seq)
    buf = bytearray(_request(GETROUTE_MAIN_DUMP, seq)) + _attr(RTA_OIF, _U32.pack(oif))
    struct.pack_into("=I", buf, _LEN_OFFSET, len(buf))
    return bytes(buf)


def _routes(sock: socket.socket, seq: int, oif: int | None = None) -> list[RouteState]:
    """Every route (oif None), or the main table's through link `oif` (the kernel filters when
    strict checking is on; the caller compares table and oif anyway)."""
    for _ in range(_DUMP_ATTEMPTS):
        sock.send(_route_request(seq, oif))
        out, interrupted = _receive(sock, seq)
        if not interrupted:
            return [r for r in map(decode_route, out) if r is not None]
        seq += 1
    raise NetlinkError(errno.EAGAIN, f"netlink dump {RTM_GETROUTE} kept changing under us")


def _get_link(sock: socket.socket, ifname: str, seq: int) -> Link | None:
    """One link by name (a GET, not a dump: only that link is encoded and decoded), or None."""
    sock.send(_request(GETLINK, seq, ifname=ifname))
    try:
        out, _ = _receive(sock, seq, single=True)
    except NetlinkError as exc:
        if exc.errno == errno.ENODEV:
            return None
        raise
    return decode_link(out[0]) if out else None


def _receive(sock: socket.socket, seq: int, *, single: bool = False) -> tuple[list[memoryview], bool]:
    """The answer to request `seq`: a dump's messages up to NLMSG_DONE, or (`single`) the one
    message a GET returns. An NLMSG_ERROR with a code raises NetlinkError."""
    out: list[memoryview] = []
    interrupted = False
    while True:
        data = memoryview(sock.recv(1 << 16))
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
                out.append(data[offset : offset + length])
                if single:
                    return out, interrupted
            offset += (length + 3) & ~3


def read_view(
    sock: socket.socket, netns: str, ifnames: Iterable[str], *, routes: bool = False, all_tables: bool = False
) -> NetnsView:
    """The links `ifnames` of the netns `sock` lives in, their addresses, and (`routes`) the
    routes through them in the main table (`all_tables`: every route of the netns)."""
    view = NetnsView(netns=netns)
    for seq, ifname in enumerate(dict.fromkeys(ifnames), start=1):
        link = _get_link(sock, ifname, seq)
        if link is None:
            continue
        view.links[ifname] = LinkState(
            index=link.index,
            name=ifname,
            mac=link.mac,
            up=bool(link.flags & IFF_UP),
            carrier=bool(link.flags & IFF_LOWER_UP),
        )
    for seq, state in enumerate(view.links.values(), start=100):
        # strict checking makes the kernel send only this link's addresses
        for addr in _dump(sock, seq * 10, ifa_index=state.index):
            if not addr.address or addr.index != state.index:
                continue
            view.addresses.setdefault(state.index, []).append(
                AddressState(
                    address=ipaddress.ip_interface(f"{addr.address}/{addr.prefixlen}"),
                    scope=addr.scope,
                    permanent=bool(addr.flags & IFA_F_PERMANENT),
                    dadfailed=bool(addr.flags & IFA_F_DADFAILED),
                )
            )
    if routes and all_tables:
        view.routes = _routes(sock, 90000)
    elif routes:
        view.routes = []
        for seq, state in enumerate(view.links.values(), start=9100):
            view.routes += _routes(sock, seq * 10, state.index)
    return view


def host_links(sock: socket.socket, names: Iterable[str]) -> dict[str, HostLink]:
    """The links `names` of the netns `sock` lives in (the host's), with kind and master; a
    name that is not there is left out."""
    out: dict[str, HostLink] = {}
    for seq, name in enumerate(dict.fromkeys(names), start=1):
        link = _get_link(sock, name, seq)
        if link is not None:
            out[name] = HostLink(name=name, index=link.index, kind=link.kind, master=link.master)
    return out
