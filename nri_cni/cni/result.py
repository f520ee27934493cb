"""CNI results of every released spec version, held in the 1.1.0 shape.

A plugin prints its result in the version it was configured with (or older). Internally a
result is always the 1.1.0 model; `to_dict(version)` converts back down with libcni's rules
(0.4.0 drops mtu/socketPath/pciID and adds ips[].version; 0.2.0 keeps the first IPv4 and
IPv6 address only, with their routes). Addresses are validated and written in canonical
form, as libcni's Go types do when they re-marshal a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nri_cni.cni import versions
from nri_cni.cni.result_addr import ip_family
from nri_cni.errors import CniCode, CNIError

# the spec versions of each result shape
V02 = ("0.1.0", "0.2.0")
V04 = ("0.3.0", "0.3.1", "0.4.0")
V1 = ("1.0.0", "1.1.0")


@dataclass
class Interface:
    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    pci_id: str = ""
    socket_path: str = ""
    # CNI proposal (containernetworking/cni#1050): free-form string facts about the interface
    metadata: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, kept for 1.x output


@dataclass
class IPConfig:
    address: str  # CIDR, host address and prefix: "10.244.0.5/24"
    gateway: str = ""
    interface: int | None = None  # index into Result.interfaces


@dataclass
class Route:
    dst: str
    gw: str = ""
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@dataclass
class DNS:
    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)


@dataclass
class Result:
    cni_version: str = versions.CURRENT  # the version the plugin printed it in
    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown top-level keys

    def to_dict(self, version: str = versions.CURRENT) -> dict[str, Any]:
        """The spec JSON object of this result in `version`."""
        if version in V1:
            return _to_v1(self, version)
        if version in V04:
            return _to_v04(self, version)
        if version in V02 or version == "":
            return _to_v02(self, version or "0.1.0")
        raise CNIError(CniCode.INCOMPATIBLE_VERSION, f"cannot convert a result to CNI version {version!r}")


# ---- parsing helpers -----------------------------------------------------------------------


# ---- output --------------------------------------------------------------------------------


def _route_dict(r: Route) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": r.dst}
    if r.gw:
        out["gw"] = r.gw
    for key, val in (("mtu", r.mtu), ("advmss", r.advmss), ("priority", r.priority)):
        if val:
            out[key] = val
    if r.table is not None:
        out["table"] = r.table
    if r.scope is not None:
        out["scope"] = r.scope
    return out


def _dns_dict(d: DNS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if d.nameservers:
        out["nameservers"] = list(d.nameservers)
    if d.domain:
        out["domain"] = d.domain
    if d.search:
        out["search"] = list(d.search)
    if d.options:
        out["options"] = list(d.options)
    return out


def _ip_dict(ip: IPConfig, with_version: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if with_version:
        out["version"] = "4" if ip_family(ip.address) == 4 else "6"
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = ip.address
    if ip.gateway:
        out["gateway"] = ip.gateway
    return out


def _to_v1(res: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in res.extra.items()}
    out["cniVersion"] = version
    if res.interfaces:
        ifaces = []
        for i in res.interfaces:
            d: dict[str, Any] = dict(i.extra)
            d["name"] = i.name
            for key, val in (
                ("mac", i.mac),
                ("mtu", i.mtu),
                ("sandbox", i.sandbox),
                ("socketPath", i.socket_path),
                ("pciID", i.pci_id),
            ):
                if val:
                    d[key] = val
            if i.metadata:
                d["metadata"] = dict(i.metadata)
            ifaces.append(d)
        out["interfaces"] = ifaces
    if res.ips:
        out["ips"] = [_ip_dict(ip, False) for ip in res.ips]
    if res.routes:
        out["routes"] = [_route_dict(r) for r in res.routes]
    if not res.dns.is_empty():
        out["dns"] = _dns_dict(res.dns)
    return out


def _to_v04(res: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version}
    if res.interfaces:
        ifaces = []
        for i in res.interfaces:
            d: dict[str, Any] = {"name": i.name}
            if i.mac:
                d["mac"] = i.mac
            if i.sandbox:
                d["sandbox"] = i.sandbox
            ifaces.append(d)
        out["interfaces"] = ifaces
    if res.ips:
        out["ips"] = [_ip_dict(ip, True) for ip in res.ips]
    if res.routes:
        out["routes"] = [_route_dict(r) for r in res.routes]
    out["dns"] = _dns_dict(res.dns)  # libcni's 0.4.0 type has no omitempty for dns
    return out


def _to_v02(res: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version}
    for key, family in (("ip4", 4), ("ip6", 6)):
        ip = next((i for i in res.ips if ip_family(i.address) == family), None)
        if ip is None:
            continue
        cfg: dict[str, Any] = {"ip": ip.address}
        if ip.gateway:
            cfg["gateway"] = ip.gateway
        routes = [
            {"dst": r.dst, **({"gw": r.gw} if r.gw else {})} for r in res.routes if ip_family(r.dst) == family
        ]
        if routes:
            cfg["routes"] = routes
        out[key] = cfg
    if "ip4" not in out and "ip6" not in out:
        raise CNIError(
            CniCode.INCOMPATIBLE_VERSION,
            f"cannot convert the result to CNI version {version}: no IP addresses",
        )
    out["dns"] = _dns_dict(res.dns)
    return out
