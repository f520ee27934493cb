"""The inspector's edges: what an attachment should look like, and what differs on the node."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from nri_cni.node.hostmodel import HostPort, HostSide, Lease, Masq

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
    ROUTE_MISSING = "route-missing"  # a route of the result is not in the pod's netns
    DNAT_MISSING = "dnat-missing"  # portmap's DNAT rules for a hostPort are gone (a firewall reload)
    MASQ_MISSING = "masq-missing"  # the plugin's masquerade of an address is gone (ipMasq: a reload)
    LEASE_MISSING = "lease-missing"  # the IPAM's lease of an address is gone, or another's
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
class RouteWant:
    """A route of a CNI result: its destination, and its gateway when the result names one."""

    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    table: int | None = None


@dataclass(frozen=True)
class Expectation:
    """One attachment as its owner recorded it.

    key           opaque to the inspector: the caller's name for the attachment (pod/network/ifname)
    netns         the netns path ("/var/run/netns/x", "/proc/<pid>/ns/net")
    ifname        the interface inside the netns
    addresses     every address (with prefix) the interface must carry
    mac           the MAC it had when attached, when known
    host_ifnames  host-side links the attachment made (a bridge, the veth's host end) that must exist
    routes        the result's routes, in the pod's netns through `ifname`
    container_id  the attachment's container id (what portmap's rules and host-local's leases name)
    host_ports    the hostPorts portmap must DNAT to the pod (read once a round: hostside.py)
    masq          the addresses its plugin masquerades (ipMasq; read once a round: hostside.py)
    leases        host-local's lease files of the pod's addresses
    """

    key: str
    netns: str
    ifname: str
    addresses: tuple[IPInterface, ...] = ()
    mac: str | None = None
    host_ifnames: tuple[str, ...] = ()
    routes: tuple[RouteWant, ...] = ()
    container_id: str = ""
    host_ports: tuple[HostPort, ...] = ()
    masq: tuple[Masq, ...] = ()
    leases: tuple[Lease, ...] = ()

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
    dadfailed: bool = False  # IPv6 duplicate address detection failed: the address is unusable


@dataclass(frozen=True)
class RouteState:
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    oif: int | None
    table: int


@dataclass
class NetnsView:
    """One netns as netlink showed it; `error` set when it could not be read (gone or otherwise)."""

    netns: str
    links: dict[str, LinkState] = field(default_factory=dict)
    addresses: dict[int, list[AddressState]] = field(default_factory=dict)  # by link index
    routes: list[RouteState] | None = None  # None: not read (no expectation of this netns has routes)
    gone: bool = False
    error: str = ""


RT_SCOPE_UNIVERSE = 0


def compare(
    exp: Expectation,
    view: NetnsView,
    host_links: Mapping[str, HostLink] | None = None,
    host: HostSide | None = None,
) -> Finding:
    """The differences between `exp` and what `view` (and the host's links and rules and
    leases, when read) shows."""
    if view.gone:
        return Finding(exp, (Difference(FindingKind.NETNS_GONE, f"netns {exp.netns} is gone: {view.error}"),))
    if view.error:
        return Finding(
            exp, (Difference(FindingKind.UNREADABLE, f"cannot read netns {exp.netns}: {view.error}"),)
        )
    diffs: list[Difference] = []
    if host_links is not None:
        diffs += _host_differences(exp, host_links)
    if host is not None:
        diffs += _rule_and_lease_differences(exp, host)
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
    have_addrs = {a.address for a in have if not a.dadfailed}
    failed = {a.address for a in have if a.dadfailed}
    for want in exp.addresses:
        if want in failed:
            why = f"{exp.ifname} has {want}, but its duplicate address detection failed"
            diffs.append(Difference(FindingKind.ADDRESS_MISSING, why))
        elif want not in have_addrs:
            diffs.append(Difference(FindingKind.ADDRESS_MISSING, f"{exp.ifname} lacks {want}"))
    diffs += _route_differences(exp, view, link.index)
    wanted = set(exp.addresses)
    for a in have:
        # link-scope addresses (fe80::/10) and dynamic ones (SLAAC) are the kernel's, not the plugin's
        if a.scope == RT_SCOPE_UNIVERSE and a.permanent and a.address not in wanted:
            diffs.append(Difference(FindingKind.ADDRESS_EXTRA, f"{exp.ifname} has unexpected {a.address}"))
    return Finding(exp, tuple(diffs))


RT_TABLE_MAIN = 254


def _route_differences(exp: Expectation, view: NetnsView, index: int) -> list[Difference]:
    """Each route of the result must be in the netns through the interface (in its table, the
    main one by default), with the result's gateway when it names one."""
    if not exp.routes:
        return []
    if view.routes is None:
        return [Difference(FindingKind.UNREADABLE, f"the routes of {exp.netns} were not read")]
    diffs = []
    for want in exp.routes:
        table = want.table or RT_TABLE_MAIN
        if not any(
            r.dst == want.dst
            and r.table == table
            and r.oif in (index, None)
            and (want.gw is None or r.gw == want.gw)
            for r in view.routes
        ):
            via = f" via {want.gw}" if want.gw else ""
            diffs.append(
                Difference(FindingKind.ROUTE_MISSING, f"no route to {want.dst}{via} on {exp.ifname}")
            )
    return diffs


def _rule_and_lease_differences(exp: Expectation, host: HostSide) -> list[Difference]:
    diffs = []
    for hp in exp.host_ports:
        err = host.errors.get(hp.table)
        if err:
            why = f"cannot read portmap's IPv{hp.family} DNAT rules ({hp.backend}): {err}"
            diffs.append(Difference(FindingKind.UNREADABLE, why))
        elif (hp.proto, hp.port) not in host.dnat.get(hp.table, {}).get(exp.container_id, set()):
            why = f"no IPv{hp.family} DNAT rule of portmap ({hp.backend}) for hostPort {hp.proto}/{hp.port}"
            diffs.append(Difference(FindingKind.DNAT_MISSING, why))
    for m in exp.masq:
        err = host.errors.get(m.table)
        if err:
            why = f"cannot read the IPv{m.family} masquerade rules ({m.backend}): {err}"
            diffs.append(Difference(FindingKind.UNREADABLE, why))
        elif m.ip not in host.masq.get(m.table, {}).get(m.owner, set()):
            why = f"no IPv{m.family} masquerade rule ({m.backend}, ipMasq) for {m.ip}"
            diffs.append(Difference(FindingKind.MASQ_MISSING, why))
    for lease in exp.leases:
        if lease.path in host.errors:
            why = f"cannot read the lease {lease.path}: {host.errors[lease.path]}"
            diffs.append(Difference(FindingKind.UNREADABLE, why))
        elif lease.path not in host.leases:
            diffs.append(
                Difference(FindingKind.LEASE_MISSING, f"the IPAM holds no lease of {lease.ip} ({lease.path})")
            )
        elif host.leases[lease.path] != exp.container_id:
            why = f"the lease of {lease.ip} ({lease.path}) names {host.leases[lease.path][:12] or 'nobody'}"
            diffs.append(Difference(FindingKind.LEASE_MISSING, why))
    return diffs


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
        key=key,
        netns=netns,
        ifname=ifname,
        addresses=tuple(addresses),
        mac=mac or None,
        host_ifnames=hosts,
        routes=routes_of(result) if addresses else (),
    )


def routes_of(result: Mapping) -> tuple[RouteWant, ...]:
    """The result's routes (0.3.0 and later). A route without a gateway is matched on its
    destination (the plugin used the address's gateway, or none)."""
    out = []
    for route in result.get("routes") or []:
        gw = route.get("gw")
        table = route.get("table")
        out.append(
            RouteWant(
                ipaddress.ip_network(route["dst"], strict=False),
                ipaddress.ip_address(gw) if gw else None,
                int(table) if table else None,
            )
        )
    return tuple(out)
