"""The inspector's edges: what an attachment should look like, and what differs on the node."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


class FindingKind(Enum):
    """What differs, most severe first: a finding's `kind` is its first difference in this order."""

    OK = "ok"
    NETNS_GONE = "netns-gone"  # the path is gone, or is no network namespace any more
    LINK_MISSING = "link-missing"  # no interface of that name in the netns
    HOST_LINK_MISSING = "host-link-missing"  # the result's host-side link (bridge, veth) is gone
    PORT_DETACHED = "port-detached"  # the host veth is no port of the result's bridge (recreated?)
    MAC_CHANGED = "mac-changed"  # same name, another MAC: someone made a new link
    LINK_DOWN = "link-down"  # administratively down
    NO_CARRIER = "no-carrier"  # up, but its lower layer is down (e.g. the host veth set down)
    ADDRESS_MISSING = "address-missing"
    ADDRESS_EXTRA = "address-extra"  # a static global address nobody expected
    UNREADABLE = "unreadable"  # the node could not be read (not damage: nothing is known)


_SEVERITY = {kind: n for n, kind in enumerate(FindingKind)}


def parse_interface(text: str) -> IPInterface:
    """ "10.1.2.3/24" -> an IPv4Interface; raises ValueError for anything but an address/prefix."""
    if "/" not in text:
        raise ValueError(f"{text!r} has no prefix length")
    return ipaddress.ip_interface(text)


def normalize_mac(mac: str) -> str:
    return mac.strip().lower()


@dataclass(frozen=True)
class Expectation:
    """One attachment as its owner recorded it.

    key           opaque to the inspector: the caller's name for the attachment (pod/network/ifname)
    netns         the netns path ("/var/run/netns/x", "/proc/<pid>/ns/net")
    ifname        the interface inside the netns
    addresses     every address (with prefix) the interface must carry
    mac           the MAC it had when attached, when known
    host_ifnames  host-side links the attachment made (a bridge, the veth's host end) that must exist
    """

    key: str
    netns: str
    ifname: str
    addresses: tuple[IPInterface, ...] = ()
    mac: str | None = None
    host_ifnames: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.netns or not self.ifname:
            raise ValueError(f"{self.key}: an expectation needs a netns and an ifname")
        if self.mac is not None:
            object.__setattr__(self, "mac", normalize_mac(self.mac) or None)


@dataclass(frozen=True)
class Difference:
    kind: FindingKind
    reason: str  # for a human: what the node shows against what was expected


@dataclass(frozen=True)
class Finding:
    """The verdict for one expectation: no differences means "ok"."""

    expectation: Expectation
    differences: tuple[Difference, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.differences, key=lambda d: _SEVERITY[d.kind]))
        object.__setattr__(self, "differences", ordered)

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def kind(self) -> FindingKind:
        return self.differences[0].kind if self.differences else FindingKind.OK

    @property
    def kinds(self) -> frozenset[FindingKind]:
        return frozenset(d.kind for d in self.differences)

    @property
    def damaged(self) -> bool:
        """Something on the node differs (an unreadable netns is unknown, not damaged)."""
        return any(d.kind is not FindingKind.UNREADABLE for d in self.differences)

    @property
    def reason(self) -> str:
        return "; ".join(d.reason for d in self.differences) if self.differences else "ok"

    def to_dict(self) -> dict:
        e = self.expectation
        return {
            "key": e.key,
            "netns": e.netns,
            "ifname": e.ifname,
            "kind": self.kind.value,
            "reason": self.reason,
            "differences": [{"kind": d.kind.value, "reason": d.reason} for d in self.differences],
        }


# ---- what netlink shows, and the comparison (no I/O: unit-testable without root) -------------


@dataclass(frozen=True)
class LinkState:
    index: int
    name: str
    mac: str
    up: bool  # IFF_UP
    carrier: bool  # IFF_LOWER_UP


@dataclass(frozen=True)
class HostLink:
    """A host-side link an attachment's result names, as netlink shows it now."""

    name: str
    index: int
    kind: str  # IFLA_INFO_KIND: "bridge", "veth", "" when none
    master: int | None  # IFLA_MASTER: the bridge it is a port of


@dataclass(frozen=True)
class AddressState:
    address: IPInterface
    scope: int  # RT_SCOPE_UNIVERSE (0) for global addresses
    permanent: bool  # IFA_F_PERMANENT: set by hand or by a plugin, not by SLAAC/DHCP lifetimes


@dataclass
class NetnsView:
    """One netns as netlink showed it; `error` set when it could not be read (gone or otherwise)."""

    netns: str
    links: dict[str, LinkState] = field(default_factory=dict)
    addresses: dict[int, list[AddressState]] = field(default_factory=dict)  # by link index
    gone: bool = False
    error: str = ""


RT_SCOPE_UNIVERSE = 0


def compare(exp: Expectation, view: NetnsView, host_links: Mapping[str, HostLink] | None = None) -> Finding:
    """The differences between `exp` and what `view` (and the host's links, when read) shows."""
    if view.gone:
        return Finding(exp, (Difference(FindingKind.NETNS_GONE, f"netns {exp.netns} is gone: {view.error}"),))
    if view.error:
        return Finding(
            exp, (Difference(FindingKind.UNREADABLE, f"cannot read netns {exp.netns}: {view.error}"),)
        )
    diffs: list[Difference] = []
    if host_links is not None:
        diffs += _host_differences(exp, host_links)
    link = view.links.get(exp.ifname)
    if link is None:
        diffs.append(Difference(FindingKind.LINK_MISSING, f"no {exp.ifname} in {exp.netns}"))
        return Finding(exp, tuple(diffs))
    if exp.mac and link.mac != exp.mac:
        diffs.append(Difference(FindingKind.MAC_CHANGED, f"{exp.ifname} has MAC {link.mac}, not {exp.mac}"))
    if not link.up:
        diffs.append(Difference(FindingKind.LINK_DOWN, f"{exp.ifname} is down"))
    elif not link.carrier:
        diffs.append(Difference(FindingKind.NO_CARRIER, f"{exp.ifname} is up without carrier"))
    have = view.addresses.get(link.index, [])
    have_addrs = {a.address for a in have}
    for want in exp.addresses:
        if want not in have_addrs:
            diffs.append(Difference(FindingKind.ADDRESS_MISSING, f"{exp.ifname} lacks {want}"))
    wanted = set(exp.addresses)
    for a in have:
        # link-scope addresses (fe80::/10) and dynamic ones (SLAAC) are the kernel's, not the plugin's
        if a.scope == RT_SCOPE_UNIVERSE and a.permanent and a.address not in wanted:
            diffs.append(Difference(FindingKind.ADDRESS_EXTRA, f"{exp.ifname} has unexpected {a.address}"))
    return Finding(exp, tuple(diffs))


def _host_differences(exp: Expectation, host_links: Mapping[str, HostLink]) -> list[Difference]:
    """Host links the result named must exist; where the result names a bridge, its veths must
    still be its ports: a bridge deleted and made again (by the next pod's ADD) has the same name
    but none of the old ports, and the pods behind them are cut off."""
    diffs = []
    present = [host_links[n] for n in exp.host_ifnames if n in host_links]
    for name in exp.host_ifnames:
        if name not in host_links:
            diffs.append(Difference(FindingKind.HOST_LINK_MISSING, f"host link {name} is gone"))
    bridges = {h.index: h.name for h in present if h.kind == "bridge"}
    if bridges:
        for h in present:
            if h.kind == "veth" and h.master not in bridges:
                names = ", ".join(sorted(bridges.values()))
                diffs.append(
                    Difference(FindingKind.PORT_DETACHED, f"host veth {h.name} is no port of {names}")
                )
    return diffs


# ---- expectations from a CNI result ------------------------------------------------------------


def expectation_from_result(
    result: Mapping, *, key: str, netns: str, ifname: str, with_host_links: bool = True
) -> Expectation:
    """The expectation for the attachment `ifname` in `netns` from its CNI result, as the libcni
    cache keeps it (in the version the plugin printed).

    0.3.0 and later: the addresses are the result's IPs that point at `ifname`'s entry (or at no
    interface, when the result lists only that one sandbox interface); the MAC is the entry's;
    host links are the entries without a sandbox (the bridge, the veth's host end).
    0.1.0/0.2.0 (`ip4`, `ip6`, no interfaces): the two addresses, nothing else is known."""
    if "interfaces" not in result and ("ip4" in result or "ip6" in result):
        old = [
            result[k]["ip"]
            for k in ("ip4", "ip6")
            if isinstance(result.get(k), Mapping) and result[k].get("ip")
        ]
        return Expectation(key=key, netns=netns, ifname=ifname, addresses=tuple(map(parse_interface, old)))
    interfaces = list(result.get("interfaces") or [])
    own: int | None = None
    for n, iface in enumerate(interfaces):
        if iface.get("name") == ifname and iface.get("sandbox"):
            own = n
            break
    sandboxed = [n for n, iface in enumerate(interfaces) if iface.get("sandbox")]
    addresses = []
    for ip in result.get("ips") or []:
        idx = ip.get("interface")
        if (own is not None and idx == own) or (idx is None and sandboxed in ([], [own])):
            addresses.append(parse_interface(ip["address"]))
    mac = interfaces[own].get("mac") if own is not None else None
    hosts = tuple(i["name"] for i in interfaces if with_host_links and i.get("name") and not i.get("sandbox"))
    return Expectation(
        key=key, netns=netns, ifname=ifname, addresses=tuple(addresses), mac=mac or None, host_ifnames=hosts
    )
