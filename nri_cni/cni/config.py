"""Network configuration lists: parsing, validation and loading from a conf dir.

libcni's rules (libcni/conf.go, SPEC.md "Network configuration lists") with nri-cni's
stricter edges: a plugin `type` must be a bare file name, the network name is checked at load
time (libcni waits for ADD), and a version nri-cni cannot speak is refused at load time.
"""

from __future__ import annotations

import builtins  # the `bytes` field below shadows the builtin in its class body
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from nri_cni.cni import versions
from nri_cni.errors import ConfigError
from nri_cni.safety import files as safefs
from nri_cni.safety import jsonlimits, validate

LIST_EXTENSIONS = (".conflist",)
SINGLE_EXTENSIONS = (".conf", ".json")
FINALIZE_DROPIN_DIR = "_finalize.d"  # cannot clash with a network: names start alphanumeric

_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
_IFNAME_MAX = 15  # IFNAMSIZ - 1


def validate_network_name(name: str) -> None:
    if not name:
        raise ConfigError("missing network name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid characters in network name {name!r}")


def validate_container_id(cid: str) -> None:
    if not cid:
        raise ConfigError("missing container ID")
    if not validate.is_valid_id(cid):
        raise ConfigError(f"invalid characters in container ID {validate.quote(cid)}")


def validate_ifname(name: str) -> None:
    problem = validate.ifname_problem(name)
    if problem:
        raise ConfigError(f"interface name {validate.quote(name)} {problem}")


@dataclass(frozen=True)
class PluginConf:
    type: str  # a bare executable name, looked up in the bin dirs
    conf: dict[str, Any]  # the plugin's own JSON object as written

    @property
    def capabilities(self) -> dict[str, bool]:
        return self.conf.get("capabilities") or {}


@dataclass(frozen=True)
class NetworkConfigList:
    name: str
    cni_version: str  # negotiated: the highest of cniVersion/cniVersions nri-cni supports
    plugins: tuple[PluginConf, ...]
    finalize_plugins: tuple[PluginConf, ...] = ()
    disable_check: bool = False
    disable_gc: bool = False
    raw: dict[str, Any] = field(default_factory=dict[str, Any])
    bytes: builtins.bytes = b""  # exactly what goes into the cache's "config" field
    source: str = ""  # file path, or "inline:<where>"
    load_only_inlined_plugins: bool = False


def parse_plugin(obj: Any, where: str = "") -> PluginConf:
    """One plugin object; `type` must name a file, not a path."""
    if not isinstance(obj, dict):
        raise ConfigError(f"plugin config is a JSON {type(obj).__name__}, not an object", location=where)
    ptype = obj.get("type")
    if not isinstance(ptype, str) or not ptype:
        raise ConfigError("plugin config has no 'type'", location=where)
    if "/" in ptype or "\\" in ptype or "\0" in ptype or ".." in ptype or ptype == ".":
        raise ConfigError(f"plugin type {ptype!r} must be a bare executable name", location=where)
    caps = obj.get("capabilities")
    if caps is not None and (
        not isinstance(caps, dict) or not all(isinstance(v, bool) for v in caps.values())
    ):
        raise ConfigError("plugin 'capabilities' must map names to booleans", location=where)
    return PluginConf(type=ptype, conf=obj)


def parse_conflist(data: bytes | str | dict[str, Any], source: str = "") -> NetworkConfigList:
    """A whole conflist (raises ConfigError naming `source` and the reason)."""
    net = _parse_list(data, source)
    if not net.plugins:
        raise ConfigError("no plugins in list", location=source)
    return net


def load_conflist_file(path: str | os.PathLike[str]) -> NetworkConfigList:
    """A .conflist (plus drop-ins from <dir>/<name>/*.conf), or a .conf/.json holding one
    plugin, wrapped into a list as libcni's ConfListFromConf does."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", location=path) from None
    if not path.endswith(LIST_EXTENSIONS):
        return _wrap_single(data, path)
    net = _parse_list(data, path)
    if not net.load_only_inlined_plugins:
        net = _with_dropins(net, os.path.join(os.path.dirname(path), net.name))
    if not net.plugins:
        raise ConfigError("no plugin configs found", location=path)
    return net


def load_conf_dir(path: str | os.PathLike[str]) -> tuple[list[NetworkConfigList], list[ConfigError]]:
    """Every network in a conf dir, in lexical file order. A bad file is reported and skipped;
    so is a later file reusing a network name (the cache is keyed by name)."""
    path = os.fspath(path)
    nets: list[NetworkConfigList] = []
    errors: list[ConfigError] = []
    try:
        files = _conf_files(path, LIST_EXTENSIONS + SINGLE_EXTENSIONS)
    except OSError as exc:
        return nets, [ConfigError(f"cannot list conf dir: {exc.strerror}", location=path)]
    seen: dict[str, str] = {}
    for file in files:
        try:
            net = load_conflist_file(file)
        except ConfigError as exc:
            errors.append(exc)
            continue
        if net.name in seen:
            errors.append(
                ConfigError(f"network {net.name!r} is already defined in {seen[net.name]}", location=file)
            )
            continue
        seen[net.name] = file
        nets.append(net)
    return nets, errors


def load_finalize_dropins(
    confdir: str | os.PathLike[str], *, trust: bool = True
) -> tuple[tuple[PluginConf, ...], list[ConfigError]]:
    """FINALIZE plugins from <confdir>/_finalize.d/*.conf, for every network; bad files skipped,
    and so are files another user can write (trust=False: used, with a warning)."""
    dropdir = os.path.join(os.fspath(confdir), FINALIZE_DROPIN_DIR)
    plugins: list[PluginConf] = []
    errors: list[ConfigError] = []
    try:
        files = _conf_files(dropdir, (".conf",))
    except OSError as exc:
        return (), [ConfigError(f"cannot list drop-in dir: {exc.strerror}", location=dropdir)]
    for file in files:
        problem = safefs.check_trusted(file, enforce=trust, what="finalize drop-in")
        if problem:
            errors.append(ConfigError(f"not trusted: {problem} (files.trust: warn allows it)", location=file))
            continue
        try:
            plugins.append(parse_plugin(_read_json(file), file))
        except ConfigError as exc:
            errors.append(exc)
    return tuple(plugins), errors


def finalize_dir_plugins(
    path: str, *, trust: bool = True
) -> tuple[tuple[PluginConf, ...], list[ConfigError]]:
    """The plugins of the `_finalize.d` dir the config names (cni.finalize_dir, validated to be
    one), read by libcni's rule below its conf dir; none when the dir does not exist."""
    path = path.rstrip("/")
    if not path or not os.path.isdir(path):
        return (), []
    return load_finalize_dropins(os.path.dirname(path), trust=trust)


# ---- internals -----------------------------------------------------------------------------


def _conf_files(path: str, extensions: tuple[str, ...]) -> list[str]:
    """Regular files (or links to them) with one of `extensions`, sorted; [] if no dir."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return []
    return sorted(e.path for e in entries if e.name.endswith(extensions) and e.is_file())


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return jsonlimits.loads(f.read(jsonlimits.MAX_BYTES + 1))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", location=path) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid JSON: {exc}", location=path) from None


def _read_bool(raw: dict[str, Any], key: str, where: str) -> bool:
    """libcni accepts a JSON bool or the strings "true"/"false" (any case)."""
    val = raw.get(key, False)
    if isinstance(val, bool):
        return val
    if isinstance(val, str) and val.lower() in ("true", "false"):
        return val.lower() == "true"
    raise ConfigError(f"invalid value {val!r} for {key}", location=where)


def _parse_list(data: bytes | str | dict[str, Any], where: str) -> NetworkConfigList:
    if isinstance(data, dict):
        raw = data
        data = json.dumps(raw, separators=(",", ":")).encode()
    else:
        if isinstance(data, str):
            data = data.encode()
        try:
            raw = jsonlimits.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"invalid JSON: {exc}", location=where) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config list is a JSON {type(raw).__name__}, not an object", location=where)

    name = raw.get("name")
    if not isinstance(name, str):
        raise ConfigError("config list has no string 'name'", location=where)
    try:
        validate_network_name(name)
    except ConfigError as exc:
        raise ConfigError(exc.msg, location=where) from None

    declared = raw.get("cniVersion", "")
    listed = raw.get("cniVersions", [])
    if not isinstance(declared, str):
        raise ConfigError("cniVersion must be a string", location=where)
    if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
        raise ConfigError("cniVersions must be a list of strings", location=where)
    try:
        cni_version = versions.negotiate(declared, listed)
    except ValueError as exc:
        raise ConfigError(str(exc), location=where) from None

    inlined_only = _read_bool(raw, "loadOnlyInlinedPlugins", where)
    if "plugins" not in raw and inlined_only:
        raise ConfigError("loadOnlyInlinedPlugins is true and there is no 'plugins' key", location=where)
    return NetworkConfigList(
        name=name,
        cni_version=cni_version,
        plugins=_plugin_list(raw, "plugins", where, required="plugins" in raw),
        finalize_plugins=_plugin_list(raw, "finalize_plugins", where, required=False),
        disable_check=_read_bool(raw, "disableCheck", where),
        disable_gc=_read_bool(raw, "disableGC", where),
        raw=raw,
        bytes=data,
        source=where,
        load_only_inlined_plugins=inlined_only,
    )


def _plugin_list(raw: dict[str, Any], key: str, where: str, required: bool) -> tuple[PluginConf, ...]:
    items = raw.get(key, [])
    if not isinstance(items, list):
        raise ConfigError(f"'{key}' must be a list", location=where)
    if required and not items:
        raise ConfigError(f"no plugins in '{key}'", location=where)
    return tuple(
        parse_plugin(p, f"{where}: {key}[{i}]" if where else f"{key}[{i}]") for i, p in enumerate(items)
    )


def _wrap_single(data: bytes, path: str) -> NetworkConfigList:
    try:
        conf = jsonlimits.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid JSON: {exc}", location=path) from None
    parse_plugin(conf, path)
    wrapped = {"cniVersion": conf.get("cniVersion", ""), "name": conf.get("name"), "plugins": [conf]}
    return _parse_list(json.dumps(wrapped, separators=(",", ":"), sort_keys=True).encode(), path)


def _with_dropins(net: NetworkConfigList, dropdir: str) -> NetworkConfigList:
    """Appends <confdir>/<network>/*.conf (libcni >= 1.3). Unlike libcni, the cached config
    bytes then hold the full chain, so a DEL from the cache alone runs every plugin."""
    try:
        files = _conf_files(dropdir, (".conf",))
    except OSError as exc:
        raise ConfigError(f"cannot list drop-in dir: {exc.strerror}", location=dropdir) from None
    if not files:
        return net
    extra = tuple(parse_plugin(_read_json(f), f) for f in files)
    raw = dict(net.raw)
    raw["plugins"] = [p.conf for p in net.plugins + extra]
    raw["loadOnlyInlinedPlugins"] = True  # reloading the cached bytes must not append again
    return NetworkConfigList(
        name=net.name,
        cni_version=net.cni_version,
        plugins=net.plugins + extra,
        finalize_plugins=net.finalize_plugins,
        disable_check=net.disable_check,
        disable_gc=net.disable_gc,
        raw=raw,
        bytes=json.dumps(raw, separators=(",", ":")).encode(),
        source=net.source,
        load_only_inlined_plugins=net.load_only_inlined_plugins,
    )
