"""An attachment between its cache entry and the runtime config of its verbs: the entry an ADD
writes, the RuntimeConf a DEL or CHECK of a cached attachment runs with, and the cached result
handed to DEL and CHECK as prevResult (libcni's getCachedResult)."""

from __future__ import annotations

import logging
from typing import Any

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.config import NetworkConfigList
from nri_cni.cni.result_parse import parse_result
from nri_cni.cni.runtime_types import RuntimeConf
from nri_cni.errors import CNIError

log = logging.getLogger("nri_cni.cni.runtime")


def entry_of(network: str, config: bytes, rt: RuntimeConf) -> CacheEntry:
    """The attachment's cache entry, without its result (and without an ADD's IP request)."""
    return CacheEntry(
        container_id=rt.container_id,
        ifname=rt.ifname,
        network_name=network,
        config=config,
        netns=rt.netns,
        cni_args=list(rt.args),
        capability_args=dict(rt.capability_args),
    )


def conf_of(entry: CacheEntry, netns: str | None = None) -> RuntimeConf:
    """The runtime config a DEL or CHECK of a cached attachment runs with (`netns` overrides
    the cached path: the pod's current one, or "" when it is gone)."""
    return RuntimeConf(
        container_id=entry.container_id,
        netns=entry.netns if netns is None else netns,
        ifname=entry.ifname,
        args=list(entry.cni_args),
        capability_args=dict(entry.capability_args),
    )


def cached_prev(
    cache: ResultCache,
    net: NetworkConfigList,
    rt: RuntimeConf,
    command: str,
    entry: CacheEntry | None = None,
) -> dict[str, Any] | None:
    """The cached result in the list's version, or None (with a warning) when there is none
    usable; a corrupt entry is removed on DEL, as libcni does. `entry`: the attachment's entry
    as the caller read it already (GC, a pod's DEL or CHECK list the pod's entries first): its
    result is used and the file is not read again; read when it holds none (an entry taken
    from an intent record)."""
    if entry is None or entry.result is None:
        entry = cache.read(net.name, rt.container_id, rt.ifname, drop_corrupt=command == "DEL")
    where = f"{command} of network {net.name!r} for {rt.container_id}/{rt.ifname}"
    if entry is None or entry.result is None:
        log.warning("%s: no cached result, running without prevResult", where)
        return None
    try:
        return parse_result(entry.result, net.cni_version).to_dict(net.cni_version)
    except CNIError as exc:
        log.warning("%s: unusable cached result (%s), running without prevResult", where, exc)
        if command == "DEL":
            cache.delete(net.name, rt.container_id, rt.ifname)
        return None
