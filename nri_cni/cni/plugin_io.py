"""A plugin call's input and output: the stdin config with name, cniVersion, prevResult and
runtimeConfig injected; the printed result (or error object) read back; the VERSION answer."""

from __future__ import annotations

import json
from typing import Any

from nri_cni.cni.config import NetworkConfigList, PluginConf
from nri_cni.cni.exec_errors import excerpt
from nri_cni.cni.result import Result
from nri_cni.cni.result_parse import parse_result
from nri_cni.cni.runtime_types import RuntimeConf
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginRef
from nri_cni.safety import jsonlimits

_RESULT_KEYS = {"interfaces", "ips", "routes", "dns", "ip4", "ip6"}

# IPAM types that read addresses asked for in the config's `args.cni.ips` (CNI's conventions
# doc; the plugins repository's host-local and static). Several addresses cannot go as CNI_ARGS
# `IP=a,b`: host-local takes one address there and fails ADD and every later DEL on a list.
ARGS_IPS_IPAMS = frozenset({"host-local", "static"})


def ip_request_method(net: NetworkConfigList) -> str:
    """How an ADD of this chain can ask for given addresses: "capability" (a plugin declares
    the `ips` capability: runtimeConfig), "args" (an IPAM of ARGS_IPS_IPAMS: `args.cni.ips`),
    or "" (neither: the chain cannot be asked for an address)."""
    if any(p.capabilities.get("ips") is True for p in net.plugins):
        return "capability"
    if any(_ipam_type(p) in ARGS_IPS_IPAMS for p in net.plugins):
        return "args"
    return ""


def _ipam_type(plugin: PluginConf) -> str:
    ipam = plugin.conf.get("ipam")
    kind = ipam.get("type") if isinstance(ipam, dict) else None
    return kind if isinstance(kind, str) else ""


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps() with options makes one per call


def plugin_stdin(
    net: NetworkConfigList,
    plugin: PluginConf,
    rt: RuntimeConf | None,
    prev: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
    *,
    ask_ips: bool = False,
) -> bytes:
    """The plugin's config with name, cniVersion, prevResult and runtimeConfig injected
    (runtimeConfig: only the capabilities the plugin declares true, and only if any).

    ask_ips (ADD only): rt.ip_request goes to a plugin declaring the `ips` capability as
    runtimeConfig.ips, else to a plugin whose IPAM reads them as `args.cni.ips`."""
    conf = dict(plugin.conf)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    if prev is not None:
        conf["prevResult"] = prev
    if rt is not None and rt.capability_args:
        rc = {
            cap: rt.capability_args[cap]
            for cap, on in plugin.capabilities.items()
            if on and cap in rt.capability_args
        }
        if rc:
            conf["runtimeConfig"] = rc
    if ask_ips and rt is not None and rt.ip_request:
        if plugin.capabilities.get("ips") is True:
            conf["runtimeConfig"] = {**_dict(conf.get("runtimeConfig")), "ips": list(rt.ip_request)}
        elif _ipam_type(plugin) in ARGS_IPS_IPAMS:
            args = _dict(conf.get("args"))
            args["cni"] = {**_dict(args.get("cni")), "ips": list(rt.ip_request)}
            conf["args"] = args
    if extra:
        conf.update(extra)
    return _COMPACT.encode(conf).encode()


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def plugin_result(net: NetworkConfigList, plugin: PluginConf, command: str, out: bytes) -> Result:
    try:
        obj = jsonlimits.loads(out)
    except (ValueError, UnicodeDecodeError):
        obj = None  # parse_result words the error
    if type(obj) is dict:
        code = obj.get("code")
        if type(code) is int and "msg" in obj and not _RESULT_KEYS & obj.keys():
            # an error object with exit status 0: libcni would take it for an empty result
            details = obj.get("details")
            raise CNIError(
                code,
                str(obj["msg"]),
                details=details if isinstance(details, str) else "",
                ref=PluginRef(network=net.name, plugin=plugin.type, command=command),
            )
        try:
            return parse_result(obj, net.cni_version)
        except CNIError as exc:
            error = exc
    else:
        error = None
    ref = PluginRef(network=net.name, plugin=plugin.type, command=command)
    stderr = getattr(out, "stderr", b"")
    if not out.strip():
        raise PluginExecError(
            f"plugin {plugin.type} exited 0 but printed no result",
            details=excerpt(b"", stderr),
            ref=ref,
            code=CniCode.DECODING_FAILURE,
        )
    if error is None:
        try:
            parse_result(out if obj is None else obj, net.cni_version)
        except CNIError as exc:
            error = exc
    assert error is not None  # only a dict parses
    raise PluginExecError(
        f"plugin {plugin.type} printed an unusable result: {error.msg}",
        details=excerpt(out, stderr),
        ref=ref,
        code=error.code,
    ) from None


def version_answer(plugin_type: str, out: bytes, ref: PluginRef) -> dict[str, Any]:
    """A plugin's VERSION output checked: {"cniVersion", "supportedVersions"}."""
    try:
        info = jsonlimits.loads(out)
    except (ValueError, UnicodeDecodeError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("cniVersion"), str) or not info["cniVersion"]:
        raise PluginExecError(
            f"plugin {plugin_type} printed no valid VERSION answer",
            details=excerpt(out, getattr(out, "stderr", b"")),
            ref=ref,
            code=CniCode.DECODING_FAILURE,
        )
    supported = info.get("supportedVersions")
    if not supported and info["cniVersion"] == "0.2.0":
        info["supportedVersions"] = ["0.1.0", "0.2.0"]
    elif not isinstance(supported, list) or not supported or not all(isinstance(v, str) for v in supported):
        raise PluginExecError(
            f"plugin {plugin_type} VERSION answer has no supportedVersions",
            ref=ref,
            code=CniCode.DECODING_FAILURE,
        )
    return info
