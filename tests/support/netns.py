"""Network namespaces and their links, through netlink: a named namespace (made with its
loopback up, removed if it exists), and what netlink says about links and routes on the host or
in a namespace (read, looked up, deleted). Nothing here cleans up by itself: tests/support/janitor.py
makes these and removes them."""

from __future__ import annotations

import errno
import ipaddress
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2 import netns as _pr_netns

from tests.support.names import unique_name

NETNS_DIR = "/var/run/netns"


@dataclass
class LinkInfo:
    """What netlink says about one link (enough for tests to compare with a CNI result)."""

    name: str
    index: int
    kind: str
    mac: str
    mtu: int
    up: bool
    addrs: list[str] = field(default_factory=list)  # "ip/prefixlen"
    master: int | None = None
    link_netnsid: int | None = None
    peer_index: int | None = None  # IFLA_LINK (veth peer index, macvlan master index)

    def has_addr(self, cidr: str) -> bool:
        want = ipaddress.ip_interface(cidr)
        return any(ipaddress.ip_interface(a) == want for a in self.addrs)


def iproute(netns: str | Netns | None) -> IPRoute:
    """A netlink socket on the host (None) or in a namespace (a Netns, a name or a path)."""
    if netns is None:
        return IPRoute()
    name = netns.name if isinstance(netns, Netns) else netns_name(netns)
    return IPRoute(netns=name)


def netns_name(ref: str) -> str:
    """A named netns from a name or a /var/run/netns path; any other path as it is (pyroute2
    takes a name or an absolute path: CRI-O pins netns under its namespaces_dir)."""
    if "/" in ref:
        p = Path(ref)
        if str(p.parent) not in (NETNS_DIR, "/run/netns"):
            return str(p)
        return p.name
    return ref


def _link_info(ipr: IPRoute, msg) -> LinkInfo:
    info = msg.get_attr("IFLA_LINKINFO")
    kind = (info.get_attr("IFLA_INFO_KIND") if info is not None else None) or ""
    idx = msg["index"]
    addrs = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=idx)]
    return LinkInfo(
        name=msg.get_attr("IFLA_IFNAME"),
        index=idx,
        kind=kind,
        mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get_attr("IFLA_MTU") or 0,
        up=bool(msg["flags"] & 1),
        addrs=addrs,
        master=msg.get_attr("IFLA_MASTER"),
        link_netnsid=msg.get_attr("IFLA_LINK_NETNSID"),
        peer_index=msg.get_attr("IFLA_LINK"),
    )


def list_links(netns: str | Netns | None = None) -> list[LinkInfo]:
    """Every link of the host (netns None) or of a named namespace."""
    with iproute(netns) as ipr:
        return [_link_info(ipr, m) for m in ipr.get_links()]


def get_link(name: str, netns: str | Netns | None = None) -> LinkInfo | None:
    """One link by name, or None if there is no such link."""
    with iproute(netns) as ipr:
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            return None
        try:
            return _link_info(ipr, ipr.get_links(idx[0])[0])
        except Exception as exc:  # vanished between lookup and get
            if getattr(exc, "code", None) == errno.ENODEV:
                return None
            raise


def link_exists(name: str, netns: str | Netns | None = None) -> bool:
    with iproute(netns) as ipr:
        return bool(ipr.link_lookup(ifname=name))


def delete_link(name: str, netns: str | Netns | None = None) -> bool:
    """Delete a link if it exists; True if something was deleted."""
    with iproute(netns) as ipr:
        idx = ipr.link_lookup(ifname=name)
        if not idx:
            return False
        try:
            ipr.link("del", index=idx[0])
        except Exception as exc:
            if getattr(exc, "code", None) == errno.ENODEV:
                return False
            raise
        return True


def list_routes(netns: str | Netns | None = None, family: int = 2) -> list[dict]:
    """Main-table routes as dicts {dst, gw, dev} (dst "default" for the default route)."""
    out = []
    with iproute(netns) as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.get_links()}
        for r in ipr.get_routes(family=family, table=254):
            dst = r.get_attr("RTA_DST")
            out.append(
                {
                    "dst": f"{dst}/{r['dst_len']}" if dst else "default",
                    "gw": r.get_attr("RTA_GATEWAY") or "",
                    "dev": names.get(r.get_attr("RTA_OIF"), ""),
                }
            )
    return out


def netnsid_of(ns: Netns | str) -> int | None:
    """The id the host namespace has assigned to a named namespace (None if none yet)."""
    path = ns.path if isinstance(ns, Netns) else os.path.join(NETNS_DIR, netns_name(ns))
    fd = os.open(path, os.O_RDONLY)
    try:
        with IPRoute() as ipr:
            r = ipr.get_netnsid(fd=fd)
        nsid = r.get("nsid") if isinstance(r, dict) else None
        return None if nsid is None or nsid < 0 else nsid
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Netns:
    """A named network namespace (``/var/run/netns/<name>``)."""

    name: str

    @property
    def path(self) -> str:
        return os.path.join(NETNS_DIR, self.name)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def links(self) -> list[LinkInfo]:
        return list_links(self)

    def link(self, name: str) -> LinkInfo | None:
        return get_link(name, self)

    def routes(self, family: int = 2) -> list[dict]:
        return list_routes(self, family)

    def run(self, *argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        """Run a command inside the namespace (``ip netns exec``)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def sysctl(self, key: str) -> str:
        """Read a sysctl (dotted or slashed key) inside the namespace."""
        path = "/proc/sys/" + key.replace(".", "/") if "/" not in key else "/proc/sys/" + key
        return self.run("cat", path).stdout.strip()


def create_netns(name: str | None = None) -> Netns:
    name = name or unique_name("ns")
    _pr_netns.create(name)
    ns = Netns(name)
    with iproute(ns) as ipr:  # bring loopback up, as runtimes do
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
    return ns


def delete_netns(ns: Netns | str) -> bool:
    """Remove a named namespace if it exists; True if something was removed."""
    name = ns.name if isinstance(ns, Netns) else netns_name(ns)
    if not os.path.exists(os.path.join(NETNS_DIR, name)):
        return False
    try:
        _pr_netns.remove(name)
    except FileNotFoundError:
        return False
    return True
