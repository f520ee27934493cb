"""Parsing a plugin's printed result, of any released spec version, into the 1.1.0 model
(nri_cni.cni.result); unknown keys are kept, addresses canonicalized."""

from __future__ import annotations

from typing import Any

from nri_cni.cni.result import DNS, V02, V04, V1, Interface, IPConfig, Result, Route
from nri_cni.cni.result_addr import bad_result, canonical
from nri_cni.errors import CniCode, CNIError
from nri_cni.safety import jsonlimits

_INTERFACE_KEYS = {"name", "mac", "mtu", "sandbox", "socketPath", "pciID", "metadata"}
_TOP_KEYS = {"cniVersion", "interfaces", "ips", "routes", "dns", "ip4", "ip6"}


def parse_result(obj: dict[str, Any] | bytes | str, version: str | None = None) -> Result:
    """Parses a result of any released version. `version` is used when the result names none
    (libcni takes the config's version then). Raises CNIError(DECODING_FAILURE)."""
    if isinstance(obj, (bytes, bytearray, str)):
        try:
            obj = jsonlimits.loads(obj)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad_result(f"result is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise bad_result(f"result is a JSON {type(obj).__name__}, not an object")
    ver = obj.get("cniVersion") or version or "0.1.0"
    if not isinstance(ver, str):
        raise bad_result("result cniVersion is not a string")
    if ver in V1 or ver in V04:
        res = Result(
            cni_version=ver,
            interfaces=[_interface(i, n) for n, i in enumerate(_list(obj, "interfaces"))],
            ips=[_ip(i, n) for n, i in enumerate(_list(obj, "ips"))],
            routes=[_route(r, f"routes[{n}]") for n, r in enumerate(_list(obj, "routes"))],
            dns=_dns(obj.get("dns")),
        )
    elif ver in V02:
        res = Result(cni_version=ver, dns=_dns(obj.get("dns")))
        for key in ("ip4", "ip6"):
            cfg = obj.get(key)
            if cfg is None:
                continue
            if not isinstance(cfg, dict):
                raise bad_result(f"{key} is not an object")
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


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    val = obj.get(key)
    if val is None:
        return []
    if not isinstance(val, list):
        raise bad_result(f"{key} is not a list")
    return val


def _str(val: Any, where: str) -> str:
    if val is None:
        return ""
    if not isinstance(val, str):
        raise bad_result(f"{where} is not a string")
    return val


def _int(val: Any, where: str) -> int:
    if val is None:
        return 0
    if isinstance(val, bool) or not isinstance(val, int):
        raise bad_result(f"{where} is not an integer")
    return val


def _opt_int(val: Any, where: str) -> int | None:
    return None if val is None else _int(val, where)


def _cidr(val: Any, where: str) -> str:
    text = _str(val, where)
    canon = canonical(text, True)
    if canon is None:
        raise bad_result(f"{where} {text!r} is not an address/prefix")
    return canon[0]


def _opt_ip(val: Any, where: str) -> str:
    text = _str(val, where)
    if not text:
        return ""
    canon = canonical(text, False)
    if canon is None:
        raise bad_result(f"{where} {text!r} is not an IP address")
    return canon[0]


_INTERFACE_STRS = ("name", "mac", "sandbox", "pciID", "socketPath")


def _interface(obj: Any, n: int) -> Interface:
    # written for speed (one is parsed per interface per plugin call): the path for a
    # message is only built on an error
    if type(obj) is not dict:
        raise bad_result(f"interfaces[{n}] is not an object")
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
            raise bad_result(f"interfaces[{n}].{key} is not a string")
    mtu = get("mtu")
    if mtu is not None and type(mtu) is not int:
        raise bad_result(f"interfaces[{n}].mtu is not an integer")
    meta = get("metadata")
    if meta:
        if type(meta) is not dict or not all(type(v) is str for v in meta.values()):
            raise bad_result(f"interfaces[{n}].metadata is not a map of strings")
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
        raise bad_result(f"ips[{n}] is not an object")
    address, gateway, iface = obj.get("address"), obj.get("gateway"), obj.get("interface")
    canon = canonical(address, True) if type(address) is str else None
    if canon is None:
        return IPConfig(address=_cidr(address, f"ips[{n}].address"))  # raises, worded
    if gateway:
        gateway = _opt_ip(gateway, f"ips[{n}].gateway")
    elif gateway is not None and type(gateway) is not str:
        raise bad_result(f"ips[{n}].gateway is not a string")
    if iface is not None and (type(iface) is not int):
        raise bad_result(f"ips[{n}].interface is not an integer")
    return IPConfig(address=canon[0], gateway=gateway or "", interface=iface)


def _route(obj: Any, where: str) -> Route:
    if not isinstance(obj, dict):
        raise bad_result(f"{where} is not an object")
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
        raise bad_result("dns is not an object")

    def strs(key: str) -> list[str]:
        val = obj.get(key) or []
        if not isinstance(val, list) or not all(isinstance(s, str) for s in val):
            raise bad_result(f"dns.{key} is not a list of strings")
        return list(val)

    return DNS(
        nameservers=strs("nameservers"),
        domain=_str(obj.get("domain"), "dns.domain"),
        search=strs("search"),
        options=strs("options"),
    )
