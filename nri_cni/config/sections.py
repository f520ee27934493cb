"""The settings sections of nri-cni's config file, each read into its dataclass (config/model.py
states every default; a key left out gets it). Problems are collected on the _Reader with their
key path, as parse.py does for the networks."""

from __future__ import annotations

import os
import re
from typing import Any

from nri_cni.config.model import (
    _PLUGIN_IDX,
    _PLUGIN_NAME,
    CniSettings,
    Config,
    LifecycleSettings,
    LocalSocketSettings,
    MetricsServerSettings,
    NriSettings,
    PodLimits,
    ReloadSettings,
)
from nri_cni.config.reader import _Reader

LOG_LEVELS = ("debug", "info", "warning", "error")


def trust_files(r: _Reader, data: dict) -> bool:
    files = r.section(data, "files")
    r.unknown_keys(files, {"trust"}, "files")
    default = "enforce" if Config.trust_files else "warn"
    return r.string(files, "trust", default, "files", choices=("enforce", "warn")) == "enforce"


def nri(r: _Reader, data: dict) -> NriSettings:
    nri = r.section(data, "nri")
    r.unknown_keys(nri, {"socket", "plugin_name", "plugin_index", "request_timeout"}, "nri")
    d = NriSettings
    return NriSettings(
        socket=r.string(nri, "socket", d.socket, "nri", path=True),
        plugin_name=r.string(nri, "plugin_name", d.plugin_name, "nri", pattern=_PLUGIN_NAME),
        plugin_index=r.string(nri, "plugin_index", d.plugin_index, "nri", pattern=_PLUGIN_IDX),
        request_timeout=r.duration(nri, "request_timeout", d.request_timeout, "nri"),
    )


def local(r: _Reader, daemon: dict) -> LocalSocketSettings:
    r.unknown_keys(
        daemon,
        {"socket", "allowed_uids", "allowed_gids", "max_connections", "read_timeout", "max_request_bytes"},
        "daemon",
    )
    d = LocalSocketSettings
    return LocalSocketSettings(
        allowed_uids=r.id_list(daemon, "allowed_uids", d.allowed_uids, "daemon"),
        allowed_gids=r.id_list(daemon, "allowed_gids", d.allowed_gids, "daemon"),
        max_connections=r.integer(daemon, "max_connections", d.max_connections, "daemon", low=1, high=65536),
        read_timeout=r.duration(daemon, "read_timeout", d.read_timeout, "daemon"),
        max_request_bytes=r.integer(daemon, "max_request_bytes", d.max_request_bytes, "daemon", low=1024),
    )


def limits(r: _Reader, data: dict) -> PodLimits:
    limits = r.section(data, "limits")
    r.unknown_keys(
        limits,
        {"networks_per_pod", "attachments_per_network", "parallel_per_pod", "parallel_per_node"},
        "limits",
    )
    d = PodLimits
    return PodLimits(
        networks_per_pod=r.integer(limits, "networks_per_pod", d.networks_per_pod, "limits", low=1, high=64),
        attachments_per_network=r.integer(
            limits, "attachments_per_network", d.attachments_per_network, "limits", low=1, high=64
        ),
        parallel_per_pod=r.integer(limits, "parallel_per_pod", d.parallel_per_pod, "limits", low=1, high=64),
        parallel_per_node=r.integer(
            limits, "parallel_per_node", d.parallel_per_node, "limits", low=1, high=1024
        ),
    )


def cni(r: _Reader, data: dict) -> CniSettings:
    cni = r.section(data, "cni")
    r.unknown_keys(
        cni,
        {"bin_dirs", "cache_dir", "plugin_timeout", "finalize_dir", "runtime_cache_dir", "plugin_env"},
        "cni",
    )
    d = CniSettings
    settings = CniSettings(
        bin_dirs=r.string_list(cni, "bin_dirs", d.bin_dirs, "cni", path=True),
        cache_dir=r.string(cni, "cache_dir", d.cache_dir, "cni", path=True),
        plugin_timeout=r.duration(cni, "plugin_timeout", d.plugin_timeout, "cni"),
        finalize_dir=r.string(cni, "finalize_dir", d.finalize_dir, "cni", path=True),
        runtime_cache_dir=r.string(cni, "runtime_cache_dir", d.runtime_cache_dir, "cni", path=True),
        plugin_env=r.string_list(cni, "plugin_env", d.plugin_env, "cni"),
    )
    for name in settings.plugin_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.startswith("CNI_"):
            r.fail(
                "cni.plugin_env", f"{name!r} is not an environment variable name (CNI_* are set by nri-cni)"
            )
    if os.path.basename(settings.finalize_dir.rstrip("/")) != "_finalize.d":
        r.fail("cni.finalize_dir", f"{settings.finalize_dir!r} must be a directory named _finalize.d")
    return settings


def timers(r: _Reader, data: dict) -> dict[str, Any]:
    """The gc, status and verify sections: Config's fields of those names."""
    gc = r.section(data, "gc")
    r.unknown_keys(gc, {"interval", "parallel", "unlisted_grace"}, "gc")
    status = r.section(data, "status")
    r.unknown_keys(status, {"interval", "refuse_when_not_ready"}, "status")
    verify = r.section(data, "verify")
    r.unknown_keys(verify, {"interval", "check_every"}, "verify")
    d = Config
    return {
        "gc_interval": r.duration(gc, "interval", d.gc_interval, "gc"),
        "gc_parallel": r.integer(gc, "parallel", d.gc_parallel, "gc", high=256),
        "gc_unlisted_grace": r.duration(gc, "unlisted_grace", d.gc_unlisted_grace, "gc"),
        "status_interval": r.duration(status, "interval", d.status_interval, "status"),
        "refuse_when_not_ready": r.boolean(
            status, "refuse_when_not_ready", d.refuse_when_not_ready, "status"
        ),
        "verify_interval": r.duration(verify, "interval", d.verify_interval, "verify"),
        "verify_check_every": r.integer(
            verify, "check_every", d.verify_check_every, "verify", low=1, high=10000
        ),
    }


def metrics(r: _Reader, data: dict) -> tuple[str, MetricsServerSettings]:
    metrics = r.section(data, "metrics")
    r.unknown_keys(metrics, {"listen", "max_connections", "timeout"}, "metrics")
    d = MetricsServerSettings
    server = MetricsServerSettings(
        max_connections=r.integer(metrics, "max_connections", d.max_connections, "metrics", low=1, high=1024),
        timeout=r.duration(metrics, "timeout", d.timeout, "metrics"),
    )
    listen = r.string(metrics, "listen", Config.metrics_listen, "metrics")
    if listen and not local_listen(listen):
        r.fail("metrics.listen", f"{listen!r}: only a unix socket path or 127.0.0.1:PORT")
    return listen, server


def lifecycle(r: _Reader, data: dict) -> LifecycleSettings:
    lifecycle = r.section(data, "lifecycle")
    r.unknown_keys(lifecycle, {"retry_initial", "retry_max"}, "lifecycle")
    d = LifecycleSettings
    settings = LifecycleSettings(
        retry_initial=r.duration(lifecycle, "retry_initial", d.retry_initial, "lifecycle"),
        retry_max=r.duration(lifecycle, "retry_max", d.retry_max, "lifecycle"),
    )
    if settings.retry_initial <= 0:
        r.fail("lifecycle.retry_initial", "must be more than 0")
    if settings.retry_max < settings.retry_initial:
        r.fail("lifecycle.retry_max", "must not be less than retry_initial")
    return settings


def reload(r: _Reader, data: dict) -> ReloadSettings:
    reload = r.section(data, "reload")
    r.unknown_keys(reload, {"watch", "rescan_interval", "debounce"}, "reload")
    d = ReloadSettings
    return ReloadSettings(
        watch=r.boolean(reload, "watch", d.watch, "reload"),
        rescan_interval=r.duration(reload, "rescan_interval", d.rescan_interval, "reload"),
        debounce=r.duration(reload, "debounce", d.debounce, "reload"),
    )


def local_listen(value: str) -> bool:
    if value.startswith("/"):
        return True
    host, _, port = value.rpartition(":")
    return host in ("127.0.0.1", "localhost", "[::1]") and port.isdigit()
