"""rtnetlink requests over a plain netlink socket, encoded and decoded by pyroute2's messages.

Per netns: one RTM_GETLINK per expected interface (a GET by name, without statistics: the kernel
sends that link only) and one address dump filtered by the kernel to that link. pyroute2's
`IPRoute` costs ~0.8 ms per netns here (an event loop per instance, every request through asyncio)
and its `netns=` argument forks a child per socket; this costs ~0.25 ms, Python's decoding of the
answers most of it.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterable
from functools import cache
from types import SimpleNamespace

from nri_cni.node.model import AddressState, HostLink, LinkState, NetnsView

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
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12  # the kernel filters dumps by the request's fields (Linux 4.20)
RTEXT_FILTER_SKIP_STATS = 1 << 3  # no IFLA_STATS/STATS64 in link messages: nothing to decode
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_DUMP_ATTEMPTS = 3  # the kernel marks a dump that raced a change; it is asked again
RECV_TIMEOUT = 2.0  # a netlink dump answers in microseconds; this only bounds a wedged kernel


class NetlinkError(OSError):
    pass


@cache
def _pyroute2() -> SimpleNamespace:
    # pyroute2's import costs ~155 ms: paid when a netns is first read, never by the shim or the CLI
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg  # lazy: 155 ms import, only to read a netns
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # lazy: 155 ms import, only to read a netns

    return SimpleNamespace(ifinfmsg=ifinfmsg, ifaddrmsg=ifaddrmsg)


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


@cache
def _template(msg_class: type, msg_type: int, flags: int, attrs: tuple = ()) -> bytes:
    """A request encoded once by pyroute2 (a few kinds in all); `_request` patches the sequence
    number, the ifaddrmsg's index and an interface name into a copy: a round encodes nothing."""
    req = msg_class()
    req["header"]["type"] = msg_type
    req["header"]["flags"] = flags
    req["attrs"] = list(attrs)
    req.encode()
    return bytes(req.data)


_LEN_OFFSET = 0  # nlmsghdr.nlmsg_len
_SEQ_OFFSET = 8  # nlmsghdr.nlmsg_seq
_IFA_INDEX_OFFSET = _HEADER.size + 4  # ifaddrmsg: family, prefixlen, flags, scope (u8 each), index
IFLA_IFNAME = 3
_NLA = struct.Struct("=HH")  # nlattr: length, type


def _request(template: bytes, seq: int, *, ifa_index: int | None = None, ifname: str | None = None) -> bytes:
    buf = bytearray(template)
    if ifname is not None:  # an IFLA_IFNAME attribute: NUL-terminated, padded to 4 bytes
        value = ifname.encode() + b"\0"
        buf += _NLA.pack(_NLA.size + len(value), IFLA_IFNAME) + value + bytes(-len(value) % 4)
        struct.pack_into("=I", buf, _LEN_OFFSET, len(buf))
    struct.pack_into("=I", buf, _SEQ_OFFSET, seq)
    if ifa_index is not None:
        struct.pack_into("=I", buf, _IFA_INDEX_OFFSET, ifa_index)
    return bytes(buf)


def _dump(
    sock: socket.socket, msg_class: type, msg_type: int, seq: int, *, ifa_index: int | None = None
) -> list:
    """Every message of one dump, decoded; asked again (a few times) when the kernel flags the
    dump as interrupted by a concurrent change."""
    template = _template(msg_class, msg_type, NLM_F_REQUEST | NLM_F_DUMP)
    for _ in range(_DUMP_ATTEMPTS):
        sock.send(_request(template, seq, ifa_index=ifa_index))
        out, interrupted = _receive(sock, msg_class, seq)
        if not interrupted:
            return out
        seq += 1
    raise NetlinkError(errno.EAGAIN, f"netlink dump {msg_type} kept changing under us")


def _get_link(sock: socket.socket, ifname: str, seq: int):
    """One link by name (a GET, not a dump: only that link is encoded and decoded), or None."""
    template = _template(
        _pyroute2().ifinfmsg, RTM_GETLINK, NLM_F_REQUEST, (("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS),)
    )
    sock.send(_request(template, seq, ifname=ifname))
    try:
        out, _ = _receive(sock, _pyroute2().ifinfmsg, seq, single=True)
    except NetlinkError as exc:
        if exc.errno == errno.ENODEV:
            return None
        raise
    return out[0] if out else None


def _receive(sock: socket.socket, msg_class: type, seq: int, *, single: bool = False) -> tuple[list, bool]:
    """The answer to request `seq`: a dump's messages up to NLMSG_DONE, or (`single`) the one
    message a GET returns. An NLMSG_ERROR with a code raises NetlinkError."""
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
                if single:
                    return out, interrupted
            offset += (length + 3) & ~3


def read_view(sock: socket.socket, netns: str, ifnames: Iterable[str]) -> NetnsView:
    """The links `ifnames` of the netns `sock` lives in, and their addresses."""
    pr = _pyroute2()
    view = NetnsView(netns=netns)
    for seq, ifname in enumerate(dict.fromkeys(ifnames), start=1):
        msg = _get_link(sock, ifname, seq)
        if msg is None:
            continue
        flags = msg["flags"]
        view.links[ifname] = LinkState(
            index=msg["index"],
            name=ifname,
            mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(),
            up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
        )
    for seq, link in enumerate(view.links.values(), start=100):
        # strict checking makes the kernel send only this link's addresses
        for msg in _dump(sock, pr.ifaddrmsg, RTM_GETADDR, seq * 10, ifa_index=link.index):
            addr = msg.get_attr("IFA_ADDRESS")
            if addr is None or msg["index"] != link.index:
                continue
            flags = msg.get_attr("IFA_FLAGS")
            flags = msg["flags"] if flags is None else flags
            view.addresses.setdefault(link.index, []).append(
                AddressState(
                    address=ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}"),
                    scope=msg["scope"],
                    permanent=bool(flags & IFA_F_PERMANENT),
                )
            )
    return view


def host_links(sock: socket.socket, names: Iterable[str]) -> dict[str, HostLink]:
    """The links `names` of the netns `sock` lives in (the host's), with kind and master; a
    name that is not there is left out."""
    out: dict[str, HostLink] = {}
    for seq, name in enumerate(dict.fromkeys(names), start=1):
        msg = _get_link(sock, name, seq)
        if msg is None:
            continue
        info = msg.get_attr("IFLA_LINKINFO")
        out[name] = HostLink(
            name=name,
            index=msg["index"],
            kind=(info.get_attr("IFLA_INFO_KIND") if info is not None else None) or "",
            master=msg.get_attr("IFLA_MASTER"),
        )
    return out
