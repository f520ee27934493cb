"""nri-cni's own configuration: the node admin's YAML file.

Parsed into frozen dataclasses and validated as a whole; every problem is reported with where it
is (file and key path, e.g. `config.yaml: networks[1].file`) and why, so that `nri-cni
check-config` and a refused hot reload can say exactly what to fix. The CNI network lists the
config points at are loaded here too (inline, from a file, or by name from a conf dir), so a config
that validates is one the daemon can run.
"""

from __future__ import annotations

import os
import re
from typing import Any

from nri_cni.cni import config as cniconf
from nri_cni.cni.config import validate_ifname, validate_network_name
from nri_cni.config.containers import parse_containers, parse_network_containers
from nri_cni.config.model import (
    _K8S_NAMESPACE,
    _PLUGIN_IDX,
    _PLUGIN_NAME,
    DEFAULT_BIN_DIRS,
    DEFAULT_CACHE_DIR,
    DEFAULT_DAEMON_SOCKET,
    DEFAULT_FINALIZE_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_RUNTIME_CACHE_DIR,
    DEFAULT_STATE_DIR,
    FAILURE_POLICIES,
    MODES,
    CniSettings,
    Config,
    LifecycleSettings,
    LocalSocketSettings,
    MetricsServerSettings,
    NetworkSpec,
    NriSettings,
    PodLimits,
    ReloadSettings,
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
    """Validates a parsed YAML document; raises ConfigError listing every problem found."""
    r = _Reader(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"the document must be a mapping, not {_kind(data)}", location=path)
    base_dir = base_dir or (os.path.dirname(os.path.abspath(path)) if path != "<config>" else os.getcwd())
    r.unknown_keys(data, _TOP_KEYS, "")

    nri = r.section(data, "nri")
    r.unknown_keys(nri, {"socket", "plugin_name", "plugin_index", "request_timeout"}, "nri")
    nri_settings = NriSettings(
        socket=r.string(nri, "socket", DEFAULT_NRI_SOCKET, "nri", path=True),
        plugin_name=r.string(nri, "plugin_name", "cni", "nri", pattern=_PLUGIN_NAME),
        plugin_index=r.string(nri, "plugin_index", "10", "nri", pattern=_PLUGIN_IDX),
        request_timeout=r.duration(nri, "request_timeout", 0.0, "nri"),
    )
    daemon = r.section(data, "daemon")
    r.unknown_keys(
        daemon,
        {"socket", "allowed_uids", "allowed_gids", "max_connections", "read_timeout", "max_request_bytes"},
        "daemon",
    )
    local_settings = LocalSocketSettings(
        allowed_uids=r.id_list(daemon, "allowed_uids", (0,), "daemon"),
        allowed_gids=r.id_list(daemon, "allowed_gids", (), "daemon"),
        max_connections=r.integer(daemon, "max_connections", 128, "daemon", low=1, high=65536),
        read_timeout=r.duration(daemon, "read_timeout", 10.0, "daemon"),
        max_request_bytes=r.integer(
            daemon, "max_request_bytes", LocalSocketSettings.max_request_bytes, "daemon", low=1024
        ),
    )
    limits = r.section(data, "limits")
    r.unknown_keys(
        limits,
        {"networks_per_pod", "attachments_per_network", "parallel_per_pod", "parallel_per_node"},
        "limits",
    )
    pod_limits = PodLimits(
        networks_per_pod=r.integer(limits, "networks_per_pod", 8, "limits", low=1, high=64),
        attachments_per_network=r.integer(limits, "attachments_per_network", 2, "limits", low=1, high=64),
        parallel_per_pod=r.integer(limits, "parallel_per_pod", 4, "limits", low=1, high=64),
        parallel_per_node=r.integer(limits, "parallel_per_node", 16, "limits", low=1, high=1024),
    )
    files = r.section(data, "files")
    r.unknown_keys(files, {"trust"}, "files")
    trust_files = r.string(files, "trust", "enforce", "files", choices=("enforce", "warn")) == "enforce"
    log = r.section(data, "log")
    r.unknown_keys(log, {"level", "format"}, "log")
    cni = r.section(data, "cni")
    r.unknown_keys(
        cni,
        {"bin_dirs", "cache_dir", "plugin_timeout", "finalize_dir", "runtime_cache_dir", "plugin_env"},
        "cni",
    )
    cni_settings = CniSettings(
        bin_dirs=r.string_list(cni, "bin_dirs", DEFAULT_BIN_DIRS, "cni", path=True),
        cache_dir=r.string(cni, "cache_dir", DEFAULT_CACHE_DIR, "cni", path=True),
        plugin_timeout=r.duration(cni, "plugin_timeout", 60.0, "cni"),
        finalize_dir=r.string(cni, "finalize_dir", DEFAULT_FINALIZE_DIR, "cni", path=True),
        runtime_cache_dir=r.string(cni, "runtime_cache_dir", DEFAULT_RUNTIME_CACHE_DIR, "cni", path=True),
        plugin_env=r.string_list(cni, "plugin_env", (), "cni"),
    )
    for name in cni_settings.plugin_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.startswith("CNI_"):
            r.fail(
                "cni.plugin_env", f"{name!r} is not an environment variable name (CNI_* are set by nri-cni)"
            )
    if os.path.basename(cni_settings.finalize_dir.rstrip("/")) != "_finalize.d":
        r.fail("cni.finalize_dir", f"{cni_settings.finalize_dir!r} must be a directory named _finalize.d")
    gc = r.section(data, "gc")
    r.unknown_keys(gc, {"interval", "parallel", "unlisted_grace"}, "gc")
    status = r.section(data, "status")
    r.unknown_keys(status, {"interval", "refuse_when_not_ready"}, "status")
    verify = r.section(data, "verify")
    r.unknown_keys(verify, {"interval", "check_every"}, "verify")
    metrics = r.section(data, "metrics")
    r.unknown_keys(metrics, {"listen", "max_connections", "timeout"}, "metrics")
    metrics_server = MetricsServerSettings(
        max_connections=r.integer(metrics, "max_connections", 16, "metrics", low=1, high=1024),
        timeout=r.duration(metrics, "timeout", 5.0, "metrics"),
    )
    metrics_listen = r.string(metrics, "listen", "", "metrics")
    if metrics_listen and not _local_listen(metrics_listen):
        r.fail("metrics.listen", f"{metrics_listen!r}: only a unix socket path or 127.0.0.1:PORT")

    lifecycle = r.section(data, "lifecycle")
    r.unknown_keys(lifecycle, {"retry_initial", "retry_max"}, "lifecycle")
    lifecycle_settings = LifecycleSettings(
        retry_initial=r.duration(lifecycle, "retry_initial", 1.0, "lifecycle"),
        retry_max=r.duration(lifecycle, "retry_max", 300.0, "lifecycle"),
    )
    if lifecycle_settings.retry_initial <= 0:
        r.fail("lifecycle.retry_initial", "must be more than 0")
    if lifecycle_settings.retry_max < lifecycle_settings.retry_initial:
        r.fail("lifecycle.retry_max", "must not be less than retry_initial")
    reload = r.section(data, "reload")
    r.unknown_keys(reload, {"watch", "rescan_interval", "debounce"}, "reload")
    reload_settings = ReloadSettings(
        watch=r.boolean(reload, "watch", True, "reload"),
        rescan_interval=r.duration(reload, "rescan_interval", 30.0, "reload"),
        debounce=r.duration(reload, "debounce", 0.2, "reload"),
    )

    r.trust_files = trust_files
    networks = _parse_networks(r, data.get("networks"), base_dir)
    nad_dir = r.string(data, "nad_dir", "", "", path=True)
    if nad_dir:
        from nri_cni.config.nad import nad_networks  # lazy: only configs with nad_dir read NAD files

        nad_dir = _resolve(nad_dir, base_dir)
        nads, nad_errors = nad_networks(nad_dir, (n.name for n in networks))
        networks += [
            NetworkSpec(name=lst.name, conflist=lst, namespaces=(key.split("/", 1)[0],), nad=key)
            for key, lst in nads
        ]
        r.errors += nad_errors
    mode = r.string(data, "mode", "shim", "", choices=MODES)
    primary_network = r.string(data, "primary_network", "", "")
    if mode != "secondary" and primary_network and primary_network not in {n.name for n in networks}:
        r.fail("primary_network", f"{primary_network!r} is not one of the networks")
    if mode == "secondary" and not primary_network:
        r.fail("primary_network", "secondary mode needs the name of the runtime's own network")
    if mode != "secondary" and networks and not any(n.default for n in networks):
        r.fail("networks", "no network has `default: true`: pods would get no primary network")

    cfg = Config(
        path=path,
        mode=mode,
        nri=nri_settings,
        daemon_socket=r.string(daemon, "socket", DEFAULT_DAEMON_SOCKET, "daemon", path=True),
        state_dir=r.string(data, "state_dir", DEFAULT_STATE_DIR, "", path=True),
        log_level=r.string(log, "level", "info", "log", choices=("debug", "info", "warning", "error")),
        log_format=r.string(log, "format", "text", "log", choices=("text", "json")),
        cni=cni_settings,
        networks=tuple(networks),
        nad_dir=nad_dir,
        primary_network=primary_network,
        failure_policy=r.string(data, "failure_policy", "auto", "", choices=FAILURE_POLICIES),
        gc_interval=r.duration(gc, "interval", 600.0, "gc"),
        gc_parallel=r.integer(gc, "parallel", 0, "gc", high=256),
        gc_unlisted_grace=r.duration(gc, "unlisted_grace", 120.0, "gc"),
        status_interval=r.duration(status, "interval", 30.0, "status"),
        refuse_when_not_ready=r.boolean(status, "refuse_when_not_ready", False, "status"),
        repair_on_sync=r.boolean(data, "repair_on_sync", True, ""),
        verify_interval=r.duration(verify, "interval", 30.0, "verify"),
        verify_check_every=r.integer(verify, "check_every", 10, "verify", low=1, high=10000),
        repair=r.string(_repair_value(data), "repair", "on", "", choices=REPAIR_CHOICES),
        metrics_listen=metrics_listen,
        lifecycle=lifecycle_settings,
        reload=reload_settings,
        local=local_settings,
        limits=pod_limits,
        metrics_server=metrics_server,
        trust_files=trust_files,
        containers=parse_containers(r, data),
    )
    if r.errors:
        raise ConfigErrors(r.errors)
    return cfg


REPAIR_CHOICES = ("on", "off", "verify-only")


def _repair_value(data: dict) -> dict:
    """`repair: on` / `repair: off` unquoted are YAML 1.1 booleans: read them as the words."""
    value = data.get("repair")
    if isinstance(value, bool):
        return {"repair": "on" if value else "off"}
    return data


def _local_listen(value: str) -> bool:
    if value.startswith("/"):
        return True
    host, _, port = value.rpartition(":")
    return host in ("127.0.0.1", "localhost", "[::1]") and port.isdigit()


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
