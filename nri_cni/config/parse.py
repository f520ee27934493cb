"""nri-cni's own configuration: the node admin's YAML file.

Parsed into frozen dataclasses and validated as a whole; every problem is reported with where it
is (file and key path, e.g. `config.yaml: networks[1].file`) and why, so that `nri-cni
check-config` and a refused hot reload can say exactly what to fix. The CNI network lists the
config points at are loaded here too (inline, from a file, or by name from a conf dir), so a config
that validates is one the daemon can run.
"""

from __future__ import annotations

import os
from typing import Any

from nri_cni.cni import config as cniconf
from nri_cni.cni.config import validate_ifname, validate_network_name
from nri_cni.config import sections
from nri_cni.config.containers import parse_containers, parse_network_containers
from nri_cni.config.model import (
    _K8S_NAMESPACE,
    FAILURE_POLICIES,
    MODES,
    Config,
    NetworkSpec,
)
from nri_cni.config.reader import _join, _kind, _Reader
from nri_cni.errors import ConfigError
from nri_cni.lifecycle.spec import validate_list
from nri_cni.safety import files, jsonlimits

_TOP_KEYS = {
    "mode",
    "nri",
    "daemon",
    "state_dir",
    "log",
    "cni",
    "networks",
    "nad_dir",
    "primary_network",
    "failure_policy",
    "gc",
    "status",
    "repair_on_sync",
    "verify",
    "repair",
    "metrics",
    "lifecycle",
    "reload",
    "limits",
    "files",
    "containers",
}
_NETWORK_KEYS = {"name", "interface", "default", "namespaces", "conflist", "file", "conf_dir", "containers"}


def parse_config(data: Any, path: str = "<config>", *, base_dir: str | None = None) -> Config:
    """Validates a parsed YAML document; raises ConfigError listing every problem found. Each
    section is read by a function of its own; a key left out gets the dataclass's default
    (config/model.py: the one place defaults are stated)."""
    r = _Reader(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"the document must be a mapping, not {_kind(data)}", location=path)
    base_dir = base_dir or (os.path.dirname(os.path.abspath(path)) if path != "<config>" else os.getcwd())
    r.unknown_keys(data, _TOP_KEYS, "")
    # the sections in the order their errors are listed
    nri = sections.nri(r, data)
    daemon = r.section(data, "daemon")
    local = sections.local(r, daemon)
    limits = sections.limits(r, data)
    r.trust_files = sections.trust_files(r, data)  # before the network files are read
    log = r.section(data, "log")
    r.unknown_keys(log, {"level", "format"}, "log")
    cni = sections.cni(r, data)
    timers = sections.timers(r, data)
    metrics_listen, metrics_server = sections.metrics(r, data)
    lifecycle = sections.lifecycle(r, data)
    reload = sections.reload(r, data)
    networks, nad_dir = _networks(r, data, base_dir)
    mode, primary_network = _mode(r, data, networks)
    cfg = Config(
        path=path,
        mode=mode,
        nri=nri,
        daemon_socket=r.string(daemon, "socket", Config.daemon_socket, "daemon", path=True),
        state_dir=r.string(data, "state_dir", Config.state_dir, "", path=True),
        log_level=r.string(log, "level", Config.log_level, "log", choices=sections.LOG_LEVELS),
        log_format=r.string(log, "format", Config.log_format, "log", choices=("text", "json")),
        cni=cni,
        networks=tuple(networks),
        nad_dir=nad_dir,
        primary_network=primary_network,
        failure_policy=r.string(data, "failure_policy", Config.failure_policy, "", choices=FAILURE_POLICIES),
        repair_on_sync=r.boolean(data, "repair_on_sync", Config.repair_on_sync, ""),
        repair=r.string(_repair_value(data), "repair", Config.repair, "", choices=REPAIR_CHOICES),
        metrics_listen=metrics_listen,
        lifecycle=lifecycle,
        reload=reload,
        local=local,
        limits=limits,
        metrics_server=metrics_server,
        trust_files=r.trust_files,
        containers=parse_containers(r, data),
        **timers,
    )
    if r.errors:
        raise ConfigErrors(r.errors)
    return cfg


def _networks(r: _Reader, data: dict, base_dir: str) -> tuple[list[NetworkSpec], str]:
    """The config's networks, then those of the NetworkAttachmentDefinitions in nad_dir."""
    networks = _parse_networks(r, data.get("networks"), base_dir)
    nad_dir = r.string(data, "nad_dir", Config.nad_dir, "", path=True)
    if nad_dir:
        from nri_cni.config.nad import nad_networks  # lazy: only configs with nad_dir read NAD files

        nad_dir = _resolve(nad_dir, base_dir)
        nads, nad_errors = nad_networks(nad_dir, (n.name for n in networks))
        networks += [
            NetworkSpec(name=lst.name, conflist=lst, namespaces=(key.split("/", 1)[0],), nad=key)
            for key, lst in nads
        ]
        r.errors += nad_errors
    return networks, nad_dir


def _mode(r: _Reader, data: dict, networks: list[NetworkSpec]) -> tuple[str, str]:
    """The mode and the primary network, checked against the networks."""
    mode = r.string(data, "mode", Config.mode, "", choices=MODES)
    primary_network = r.string(data, "primary_network", Config.primary_network, "")
    if mode != "secondary" and primary_network and primary_network not in {n.name for n in networks}:
        r.fail("primary_network", f"{primary_network!r} is not one of the networks")
    if mode == "secondary" and not primary_network:
        r.fail("primary_network", "secondary mode needs the name of the runtime's own network")
    if mode != "secondary" and networks and not any(n.default for n in networks):
        r.fail("networks", "no network has `default: true`: pods would get no primary network")
    return mode, primary_network


REPAIR_CHOICES = ("on", "off", "verify-only")


def _repair_value(data: dict) -> dict:
    """`repair: on` / `repair: off` unquoted are YAML 1.1 booleans: read them as the words."""
    value = data.get("repair")
    if isinstance(value, bool):
        return {"repair": "on" if value else "off"}
    return data


def _parse_networks(r: _Reader, raw: Any, base_dir: str) -> list[NetworkSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        r.fail("networks", f"must be a list, not {_kind(raw)}")
        return []
    out: list[NetworkSpec] = []
    seen_names: set[str] = set()
    seen_ifnames: set[str] = set()
    for i, item in enumerate(raw):
        where = f"networks[{i}]"
        if not isinstance(item, dict):
            r.fail(where, f"must be a mapping, not {_kind(item)}")
            continue
        r.unknown_keys(item, _NETWORK_KEYS, where)
        name = r.string(item, "name", "", where)
        if not name:
            r.fail(_join(where, "name"), "is required")
            continue
        try:
            validate_network_name(name)
        except ConfigError as exc:
            r.fail(_join(where, "name"), exc.msg)
            continue
        if name in seen_names:
            r.fail(_join(where, "name"), f"network {name!r} is defined twice")
            continue
        seen_names.add(name)
        interface = r.string(item, "interface", "", where)
        if interface:
            try:
                validate_ifname(interface)
            except ConfigError as exc:
                r.fail(_join(where, "interface"), exc.msg)
            if interface in seen_ifnames:
                r.fail(_join(where, "interface"), f"interface {interface!r} is used twice")
            seen_ifnames.add(interface)
        namespaces = r.string_list(item, "namespaces", (), where)
        for ns in namespaces:
            if ns != "*" and not _K8S_NAMESPACE.match(ns):
                r.fail(_join(where, "namespaces"), f"{ns!r} is not a Kubernetes namespace name")
        sources = [k for k in ("conflist", "file", "conf_dir") if item.get(k) is not None]
        if len(sources) != 1:
            r.fail(where, "needs exactly one of conflist (inline), file or conf_dir")
            continue
        conflist = _load_network_list(r, item, sources[0], name, where, base_dir)
        if conflist is None:
            continue
        out.append(
            NetworkSpec(
                name=name,
                conflist=conflist,
                interface=interface,
                default=r.boolean(item, "default", False, where),
                namespaces=namespaces,
                containers=parse_network_containers(r, item, where),
            )
        )
    return out


def _load_network_list(
    r: _Reader, item: dict[str, Any], source: str, name: str, where: str, base_dir: str
) -> Any:
    try:
        if source == "conflist":
            body = item["conflist"]
            if not isinstance(body, (dict, str)):
                r.fail(_join(where, "conflist"), "must be a mapping (or a JSON string)")
                return None
            lst = cniconf.parse_conflist(body, source=f"inline:{r.path}:{where}")
        elif source == "file":
            path = _resolve(item["file"], base_dir)
            lst = cniconf.load_conflist_file(path)
        else:
            conf_dir = _resolve(item["conf_dir"], base_dir)
            lists, _errors = cniconf.load_conf_dir(conf_dir)
            matches = [lst for lst in lists if lst.name == name]
            if not matches:
                r.fail(_join(where, "conf_dir"), f"no valid network list named {name!r} in {conf_dir}")
                return None
            lst = matches[0]
    except ConfigError as exc:
        r.fail(_join(where, source), str(exc))
        return None
    except OSError as exc:
        r.fail(_join(where, source), f"cannot read: {exc.strerror or exc}")
        return None
    if lst.name != name:
        r.fail(_join(where, source), f"the network list is named {lst.name!r}, not {name!r}")
        return None
    if source != "conflist":
        # read as root and run: a list (or its dir) another user can write is refused
        problem = files.check_trusted(lst.source, enforce=r.trust_files, what="network list")
        if problem:
            r.fail(_join(where, source), f"not trusted: {problem} (files.trust: warn allows it)")
            return None
    try:
        # the "cni.dev/lifecycle" key of each plugin (INIT / DEINIT, docs/lifecycle.md)
        validate_list(lst, lst.source)
    except ConfigError as exc:
        r.fail(_join(where, source), str(exc))
        return None
    return lst


def _resolve(value: Any, base_dir: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"must be a path string, not {_kind(value)}")
    return value if os.path.isabs(value) else os.path.join(base_dir, value)


class ConfigErrors(ConfigError):
    """Several problems in one config file, reported together."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(
            first.msg,
            location=first.location,
            details=f"and {len(errors) - 1} more" if len(errors) > 1 else "",
        )
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def load_config(path: str) -> Config:
    """Reads and validates the YAML file at `path`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(jsonlimits.MAX_YAML_BYTES + 1)  # a bigger one is refused by its size
    except OSError as exc:
        raise ConfigError(f"cannot read the config: {exc.strerror or exc}", location=path) from exc
    from nri_cni.config.nodevalues import expand  # lazy: it imports PyYAML, as load_config_text does

    return load_config_text(expand(text, path), path)  # ${node.KEY}: per-node values


def load_config_text(text: str, path: str = "<config>", *, base_dir: str | None = None) -> Config:
    import yaml  # lazy: PyYAML (~15 ms) only when a config is read, not for `nri-cni --help`

    try:
        data = jsonlimits.yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML: {problem}", location=loc) from exc
    return parse_config(data, path, base_dir=base_dir)
