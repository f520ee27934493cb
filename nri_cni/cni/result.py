"""CNI results of every released spec version, held in the 1.1.0 shape.

A plugin prints its result in the version it was configured with (or older). Internally a
result is always the 1.1.0 model; `to_dict(version)` converts back down with libcni's rules
(0.4.0 drops mtu/socketPath/pciID and adds ips[].version; 0.2.0 keeps the first IPv4 and
IPv6 address only, with their routes). Addresses are validated and written in canonical
form, as libcni's Go types do when they re-marshal a result.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any

from nri_cni import jsonlimits
from nri_cni.cni import versions
from nri_cni.errors import CniCode, CNIError

_V02 = ("0.1.0", "0.2.0")
_V04 = ("0.3.0", "0.3.1", "0.4.0")
_V1 = ("1.0.0", "1.1.0")

_INTERFACE_KEYS = {"name", "mac", "mtu", "sandbox", "socketPath", "pciID", "metadata"}
_TOP_KEYS = {"cniVersion", "interfaces", "ips", "routes", "dns", "ip4", "ip6"}


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
        if version in _V1:
            return _to_v1(self, version)
        if version in _V04:
            return _to_v04(self, version)
        if version in _V02 or version == "":
            return _to_v02(self, version or "0.1.0")
        raise CNIError(CniCode.INCOMPATIBLE_VERSION, f"cannot convert a result to CNI version {version!r}")


def parse_result(obj: dict[str, Any] | bytes | str, version: str | None = None) -> Result:
    """Parses a result of any released version. `version` is used when the result names none
    (libcni takes the config's version then). Raises CNIError(DECODING_FAILURE)."""
    if isinstance(obj, (bytes, bytearray, str)):
        try:
            obj = jsonlimits.loads(obj)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _bad(f"result is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _bad(f"result is a JSON {type(obj).__name__}, not an object")
    ver = obj.get("cniVersion") or version or "0.1.0"
    if not isinstance(ver, str):
        raise _bad("result cniVersion is not a string")
    if ver in _V1 or ver in _V04:
        res = Result(
            cni_version=ver,
            interfaces=[_interface(i, n) for n, i in enumerate(_list(obj, "interfaces"))],
            ips=[_ip(i, n) for n, i in enumerate(_list(obj, "ips"))],
            routes=[_route(r, f"routes[{n}]") for n, r in enumerate(_list(obj, "routes"))],
            dns=_dns(obj.get("dns")),
        )
    elif ver in _V02:
        res = Result(cni_version=ver, dns=_dns(obj.get("dns")))
        for key in ("ip4", "ip6"):
            cfg = obj.get(key)
            if cfg is None:
                continue
            if not isinstance(cfg, dict):
                raise _bad(f"{key} is not an object")
            res.ips.append(
                IPConfig(
                    address=_cidr(cfg.get("ip"), f"{key}.ip"),
                    gateway=_opt_ip(cfg.get("gateway"), f"{key}.gateway"),
                )
            )
            res.routes += [_route(r, f"{key}.routes[{n}]") for n, r in enumerate(_list(cfg, "routes"))]
    else:
        raise CNIError(CniCode.INCOMPATIBLE_VERSION, f"unsupported result cniVersion {ver!r}")
    if not obj.keys() <= _TOP_KEYS:
        res.extra = {k: v for k, v in obj.items() if k not in _TOP_KEYS}
    return res


# ---- parsing helpers -----------------------------------------------------------------------


def _bad(msg: str) -> CNIError:
    return CNIError(CniCode.DECODING_FAILURE, f"invalid CNI result: {msg}")


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    val = obj.get(key)
    if val is None:
        return []
    if not isinstance(val, list):
        raise _bad(f"{key} is not a list")
    return val


def _str(val: Any, where: str) -> str:
    if val is None:
        return ""
    if not isinstance(val, str):
        raise _bad(f"{where} is not a string")
    return val


def _int(val: Any, where: str) -> int:
    if val is None:
        return 0
    if isinstance(val, bool) or not isinstance(val, int):
        raise _bad(f"{where} is not an integer")
    return val


def _opt_int(val: Any, where: str) -> int | None:
    return None if val is None else _int(val, where)


@functools.lru_cache(maxsize=4096)
def _canonical(text: str, with_prefix: bool) -> tuple[str, int] | None:
    """(canonical text, IP version), or None if invalid. Cached: a chain repeats the same
    addresses in every prevResult. Plain addresses go through the C parser (inet_pton /
    inet_ntop, the same canonical form); the rest (zones, IPv4-mapped IPv6, a prefix
    written with a leading zero) through ipaddress."""
    addr, slash, plen = text.partition("/")
    if bool(slash) != with_prefix:
        return None
    v6 = ":" in addr
    if "%" not in addr and "." not in (addr if v6 else ""):
        family = socket.AF_INET6 if v6 else socket.AF_INET
        try:
            canon = socket.inet_ntop(family, socket.inet_pton(family, addr))
        except (OSError, ValueError):  # ValueError: NUL
            return None
        if not v6 or "." not in canon:  # inet_ntop writes ::ffff:a.b.c.d, ipaddress does not
            if not slash:
                return canon, 6 if v6 else 4
            if plen.isascii() and plen.isdigit() and (plen == "0" or plen[0] != "0"):
                return (f"{canon}/{plen}", 6 if v6 else 4) if int(plen) <= (128 if v6 else 32) else None
    return _canonical_slow(text, with_prefix)


def _canonical_slow(text: str, with_prefix: bool) -> tuple[str, int] | None:
    try:
        addr = ipaddress.ip_interface(text) if with_prefix else ipaddress.ip_address(text)
    except ValueError:
        return None
    return str(addr), addr.version


def _cidr(val: Any, where: str) -> str:
    text = _str(val, where)
    canon = _canonical(text, True)
    if canon is None:
        raise _bad(f"{where} {text!r} is not an address/prefix")
    return canon[0]


def _opt_ip(val: Any, where: str) -> str:
    text = _str(val, where)
    if not text:
        return ""
    canon = _canonical(text, False)
    if canon is None:
        raise _bad(f"{where} {text!r} is not an IP address")
    return canon[0]


def _family(cidr: str) -> int:
    canon = _canonical(cidr, True)
    if canon is None:  # a hand-built Result
        raise _bad(f"{cidr!r} is not an address/prefix")
    return canon[1]


_INTERFACE_STRS = ("name", "mac", "sandbox", "pciID", "socketPath")


def _interface(obj: Any, n: int) -> Interface:
    # written for speed (one is parsed per interface per plugin call): the path for a
    # message is only built on an error
    if type(obj) is not dict:
        raise _bad(f"interfaces[{n}] is not an object")
    get = obj.get
    name, mac, sandbox, pci_id, socket_path = (
        get("name"),
        get("mac"),
        get("sandbox"),
        get("pciID"),
        get("socketPath"),
    )
    for val in (name, mac, sandbox, pci_id, socket_path):
        if val is not None and type(val) is not str:
            key = next(k for k in _INTERFACE_STRS if get(k) is val)
            raise _bad(f"interfaces[{n}].{key} is not a string")
    mtu = get("mtu")
    if mtu is not None and type(mtu) is not int:
        raise _bad(f"interfaces[{n}].mtu is not an integer")
    meta = get("metadata")
    if meta:
        if type(meta) is not dict or not all(type(v) is str for v in meta.values()):
            raise _bad(f"interfaces[{n}].metadata is not a map of strings")
        meta = dict(meta)
    else:
        meta = {}
    return Interface(
        name or "",
        mac or "",
        mtu or 0,
        sandbox or "",
        pci_id or "",
        socket_path or "",
        meta,
        {} if obj.keys() <= _INTERFACE_KEYS else {k: v for k, v in obj.items() if k not in _INTERFACE_KEYS},
    )


def _ip(obj: Any, n: int) -> IPConfig:
    if type(obj) is not dict:
        raise _bad(f"ips[{n}] is not an object")
    address, gateway, iface = obj.get("address"), obj.get("gateway"), obj.get("interface")
    canon = _canonical(address, True) if type(address) is str else None
    if canon is None:
        return IPConfig(address=_cidr(address, f"ips[{n}].address"))  # raises, worded
    if gateway:
        gateway = _opt_ip(gateway, f"ips[{n}].gateway")
    elif gateway is not None and type(gateway) is not str:
        raise _bad(f"ips[{n}].gateway is not a string")
    if iface is not None and (type(iface) is not int):
        raise _bad(f"ips[{n}].interface is not an integer")
    return IPConfig(address=canon[0], gateway=gateway or "", interface=iface)


def _route(obj: Any, where: str) -> Route:
    if not isinstance(obj, dict):
        raise _bad(f"{where} is not an object")
    return Route(
        dst=_cidr(obj.get("dst"), f"{where}.dst"),
        gw=_opt_ip(obj.get("gw"), f"{where}.gw"),
        mtu=_int(obj.get("mtu"), f"{where}.mtu"),
        advmss=_int(obj.get("advmss"), f"{where}.advmss"),
        priority=_int(obj.get("priority"), f"{where}.priority"),
        table=_opt_int(obj.get("table"), f"{where}.table"),
        scope=_opt_int(obj.get("scope"), f"{where}.scope"),
    )


def _dns(obj: Any) -> DNS:
    if obj is None:
        return DNS()
    if not isinstance(obj, dict):
        raise _bad("dns is not an object")

    def strs(key: str) -> list[str]:
        val = obj.get(key) or []
        if not isinstance(val, list) or not all(isinstance(s, str) for s in val):
            raise _bad(f"dns.{key} is not a list of strings")
        return list(val)

    return DNS(
        nameservers=strs("nameservers"),
        domain=_str(obj.get("domain"), "dns.domain"),
        search=strs("search"),
        options=strs("options"),
    )


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
        out["version"] = "4" if _family(ip.address) == 4 else "6"
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
        ip = next((i for i in res.ips if _family(i.address) == family), None)
        if ip is None:
            continue
        cfg: dict[str, Any] = {"ip": ip.address}
        if ip.gateway:
            cfg["gateway"] = ip.gateway
        routes = [
            {"dst": r.dst, **({"gw": r.gw} if r.gw else {})} for r in res.routes if _family(r.dst) == family
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
