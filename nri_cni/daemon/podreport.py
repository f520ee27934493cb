"""`nri-cni pods`: what each pod is attached to, in the shape of Multus's network-status.

Each pod's list has the shape of the `k8s.v1.cni.cncf.io/network-status` annotation Multus
writes (network-attachment-definition-client's `NetworkStatus`: name, interface, ips without
prefix length, mac, mtu, default, dns, device-info), plus the interface's CNI `metadata` map, so a tool that reads that annotation reads
nri-cni (schema: docs/network-status.schema.json). The daemon builds the report from what it
holds: its own libcni cache, and in secondary mode the runtime's cache for the primary network
(eth0 is not nri-cni's there, yet a pod has it); pods the runtime listed without any attachment
appear too, with an empty list. Only these: a pod the runtime no longer lists shows while
nri-cni still holds something of it (cache entries, an intent record), with "listed": false.

Each pod also carries its verdict from the last verify (nri_cni/service/podstate.py) under
"verify": {state: ok | repaired | broken, code, reason, since, repairs}, or null while no verify
has looked at it (docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.result import Result
from nri_cni.cni.result_parse import parse_result
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE, PodInfo

PRIMARY_IFNAME = "eth0"
# a pod's state in the report (the STATE column)
READY = "ready"  # the runtime lists it, every attachment it asked for is there
REPAIR = "repair"  # an attachment failed and is retried (failure_policy keep)
ROLLBACK = "rollback"  # an interrupted ADD is being undone
UNLISTED = "unlisted"  # the runtime does not list it; nri-cni still holds its attachments (GC
# releases them, or the runtime lists it soon: an ADD just finished)
HOST_NETWORK = "host-network"  # the pod uses the node's network: nothing to attach


@dataclass(frozen=True)
class PodsView:
    """The daemon's view of its pods, besides the cache."""

    listed: Mapping[str, PodInfo]  # the runtime's pods (Synchronize plus events)
    repair: Collection[str] = ()
    rollback: Collection[str] = ()
    verdicts: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # PodHealth.to_dict()


@dataclass
class _Pod:
    id: str
    namespace: str = ""
    name: str = ""
    attached_at: float | None = None
    status: list[tuple[bool, str, dict]] = field(default_factory=list)  # (runtime's?, ifname, element)


def network_status(entry: CacheEntry, name: str = "") -> dict:
    """One element of the network-status list for one cache entry (one pod, one interface);
    `name` as Multus names it ("namespace/name" for a NetworkAttachmentDefinition)."""
    result = parse_result(entry.result) if entry.result else Result()
    element: dict = {"name": name or entry.network_name, "interface": entry.ifname}
    ips = _ips_of(result, entry.ifname)
    if ips:
        element["ips"] = ips
    iface = next((i for i in result.interfaces if i.name == entry.ifname and i.sandbox), None)
    iface = iface or next((i for i in result.interfaces if i.name == entry.ifname), None)
    if iface is not None and iface.mac:
        element["mac"] = iface.mac
    if iface is not None and iface.mtu:
        element["mtu"] = iface.mtu
    if entry.ifname == PRIMARY_IFNAME:
        element["default"] = True
    element["dns"] = _dns(result)
    device = _device_info(iface.pci_id, iface.socket_path) if iface is not None else None
    if device:
        element["device-info"] = device
    if iface is not None and iface.metadata:
        element["metadata"] = dict(iface.metadata)
    return element


def _ips_of(result: Result, ifname: str) -> list[str]:
    """The addresses (no prefix length, as Multus writes them) of the interface: an IP whose
    `interface` index names another interface belongs to that one."""
    out = []
    for ip in result.ips:
        idx = ip.interface
        if idx is not None and 0 <= idx < len(result.interfaces) and result.interfaces[idx].name != ifname:
            continue
        addr = ip.address.split("/", 1)[0]
        if addr not in out:
            out.append(addr)
    return out


def _dns(result: Result) -> dict:
    dns = result.dns
    out: dict = {}
    if dns is None:
        return out
    for key, value in (
        ("nameservers", dns.nameservers),
        ("domain", dns.domain),
        ("search", dns.search),
        ("options", dns.options),
    ):
        if value:
            out[key] = list(value) if isinstance(value, list) else value
    return out


def _device_info(pci_id: str, socket_path: str) -> dict | None:
    """CNI 1.1.0's interface pciID / socketPath as Multus's device-info (spec version 1.1.0)."""
    if pci_id:
        return {"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci_id}}
    if socket_path:
        return {"type": "vhost-user", "version": "1.1.0", "vhost-user": {"path": socket_path}}
    return None


def _attached_at(entry: CacheEntry) -> float | None:
    try:
        return os.stat(entry.path).st_mtime if entry.path else None
    except OSError:
        return None


def status_order(ifname: str) -> tuple[bool, int, str]:
    """A pod's list is ordered eth0 first, then by interface name (net2 before net10)."""
    return (ifname != PRIMARY_IFNAME, len(ifname), ifname)


def pod_network_status(
    entries: Iterable[CacheEntry],
    runtime_entries: Iterable[CacheEntry] = (),
    names: Mapping[str, str] | None = None,
) -> list[tuple[str, dict]]:
    """One pod's network-status list as `pods_report` gives it, each element with the CNI
    network it came from: nri-cni's entries, then the runtime's eth0 if nri-cni has none."""
    out: list[tuple[str, dict]] = []
    for runtimes, source in ((False, entries), (True, runtime_entries)):
        for entry in source:
            if runtimes and any(e["interface"] == entry.ifname for _, e in out):
                continue
            name = (names or {}).get(entry.network_name, "")
            out.append((entry.network_name, network_status(entry, name)))
    out.sort(key=lambda s: status_order(s[1]["interface"]))
    return out


def runtime_primaries(cache: ResultCache | None, network: str) -> list[CacheEntry]:
    """Secondary mode: the runtime's own eth0 attachments, from its libcni cache."""
    if cache is None or not network:
        return []
    return [e for e in cache.entries(network=network) if e.ifname == PRIMARY_IFNAME]


def pods_report(
    entries: Iterable[CacheEntry],
    state: PodsView,
    *,
    runtime_entries: Iterable[CacheEntry] = (),
    names: Mapping[str, str] | None = None,
) -> list[dict]:
    """Every pod nri-cni attached, or the runtime listed, or the runtime attached (secondary):
    {id, namespace, name, state, attachedAt, network-status}, sorted by namespace and name.
    `names`: CNI network name -> the name to report (a NAD's "namespace/name")."""
    pods: dict[str, _Pod] = {}

    def pod_of(pod_id: str) -> _Pod:
        pod = pods.get(pod_id)
        if pod is None:
            pod = pods[pod_id] = _Pod(pod_id)
        return pod

    for runtimes, source in ((False, entries), (True, runtime_entries)):
        for entry in source:
            pod = pod_of(entry.container_id)
            if runtimes and any(ifname == entry.ifname for _, ifname, _ in pod.status):
                continue  # nri-cni's own eth0 (shim, native) wins
            args = dict(entry.cni_args)
            pod.namespace = pod.namespace or args.get(K8S_POD_NAMESPACE, "")
            pod.name = pod.name or args.get(K8S_POD_NAME, "")
            at = _attached_at(entry)
            if at is not None and (pod.attached_at is None or at < pod.attached_at):
                pod.attached_at = at
            name = (names or {}).get(entry.network_name, "")
            pod.status.append((runtimes, entry.ifname, network_status(entry, name)))
    for info in state.listed.values():
        pod = pod_of(info.id)
        pod.namespace, pod.name = info.namespace or pod.namespace, info.name or pod.name
    for pod_id in state.rollback:
        pod_of(pod_id)  # an interrupted ADD: nri-cni still holds what its intent record names
    # the runtime's list is the roster: a verdict alone (a pod the runtime dropped) shows nothing

    out = []
    for pod in pods.values():
        pod.status.sort(key=lambda s: status_order(s[1]))
        out.append(
            {
                "id": pod.id,
                "namespace": pod.namespace,
                "name": pod.name,
                "state": _state(pod, state),
                # listed by the runtime, or shown only because nri-cni still holds its resources
                "listed": pod.id in state.listed,
                "attachedAt": round(pod.attached_at, 3) if pod.attached_at is not None else None,
                "network-status": [element for _, _, element in pod.status],
                "verify": _verdict(state.verdicts.get(pod.id)),
            }
        )
    return sorted(out, key=lambda p: (p["namespace"], p["name"], p["id"]))


def _state(pod: _Pod, state: PodsView) -> str:
    if pod.id in state.rollback:
        return ROLLBACK
    if pod.id in state.repair:
        return REPAIR
    info = state.listed.get(pod.id)
    if info is None:
        return UNLISTED
    if info.host_network and not pod.status:
        return HOST_NETWORK
    return READY


VERDICT_KEYS = ("state", "code", "reason", "since", "repairs")


def _verdict(verdict: Mapping[str, object] | None) -> dict | None:
    """The pod's verdict as the report shows it (its per-attachment findings: `nri-cni verify`)."""
    if verdict is None:
        return None
    return {key: verdict.get(key) for key in VERDICT_KEYS}
