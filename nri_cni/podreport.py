"""`nri-cni pods`: what each pod is attached to, in the shape of Multus's network-status.

Each pod's list has the shape of the `k8s.v1.cni.cncf.io/network-status` annotation Multus
writes (network-attachment-definition-client's `NetworkStatus`: name, interface, ips without
prefix length, mac, default, dns, device-info), so a tool that reads that annotation reads
nri-cni (schema: docs/network-status.schema.json). The daemon builds the report from what it
holds: its own libcni cache, and in secondary mode the runtime's cache for the primary network
(eth0 is not nri-cni's there, yet a pod has it); pods the runtime listed without any attachment
appear too, with an empty list. Only these: a pod the runtime no longer lists shows while
nri-cni still holds something of it (cache entries, an intent record), with "listed": false.

Each pod also carries its verdict from the last verify (nri_cni/app/podstate.py) under
"verify": {state: ok | repaired | broken, code, reason, since, repairs}, or null while no verify
has looked at it (docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
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
class PodState:
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
    if entry.ifname == PRIMARY_IFNAME:
        element["default"] = True
    element["dns"] = _dns(result)
    device = _device_info(iface.pci_id, iface.socket_path) if iface is not None else None
    if device:
        element["device-info"] = device
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


def runtime_primaries(cache: ResultCache | None, network: str) -> list[CacheEntry]:
    """Secondary mode: the runtime's own eth0 attachments, from its libcni cache."""
    if cache is None or not network:
        return []
    return [e for e in cache.entries(network=network) if e.ifname == PRIMARY_IFNAME]


def pods_report(
    entries: Iterable[CacheEntry],
    state: PodState,
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
        pod.status.sort(key=lambda s: (s[1] != PRIMARY_IFNAME, len(s[1]), s[1]))
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


def _state(pod: _Pod, state: PodState) -> str:
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


def format_age(seconds: float) -> str:
    """kubectl's way: 45s, 12m, 3h, 5d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# -- the tables `nri-cni pods` and `nri-cni verify` print ------------------------------------


def pods_table(data: list[dict], now: float) -> str:
    rows = [("POD", "STATE", "VERIFY", "NETWORK", "INTERFACE", "IPS", "MAC", "AGE", "REASON")]
    for pod in data:
        label = _label(pod["id"], pod["namespace"], pod["name"])
        age = format_age(now - pod["attachedAt"]) if pod.get("attachedAt") else "-"
        verdict = pod.get("verify") or {}
        networks = pod["network-status"] or [{"name": "-", "interface": "-"}]
        for i, net in enumerate(networks):
            first = i == 0
            rows.append(
                (
                    label if first else "",
                    pod["state"] if first else "",
                    (verdict.get("state") or "-") if first else "",
                    net["name"],
                    net.get("interface") or "-",
                    ",".join(net.get("ips") or ()) or "-",
                    net.get("mac") or "-",
                    age if first else "",
                    _reason(verdict) if first else "",
                )
            )
    return table(rows)


def _reason(verdict: Mapping) -> str:
    """broken: code and reason; repaired: how often and what was wrong; ok: nothing."""
    if verdict.get("state") == "broken":
        return f"{verdict.get('code')}: {verdict.get('reason')}"
    if verdict.get("state") == "repaired":
        return f"{verdict.get('repairs')} repair(s): {verdict.get('reason')}"
    return ""


def verify_table(data: list[dict]) -> str:
    """`nri-cni verify`: one row per pod, with what differs (an attachment's finding)."""
    if not data:
        return "no pod to verify"
    rows = [("POD", "STATE", "REASON", "FINDINGS")]
    for v in data:
        state = v["state"] + (f" ({v['code']})" if v.get("code") else "")
        findings = [
            f"{a['network']}/{a['interface']}: {a['finding']}"
            + (f" ({a['detail']})" if a.get("detail") else "")
            for a in v.get("attachments") or ()
            if a["finding"] != "ok"
        ]
        rows.append(
            (
                _label(v["pod"], v["namespace"], v["name"]),
                state,
                v.get("reason") or "-",
                "; ".join(findings) or "-",
            )
        )
    return table(rows)


# -- every finding `nri-cni verify` can report (`nri-cni verify --kinds`, docs/reliability.md) --

ROUND = "the next verify round (verify.interval, 30 s)"
REPAIR_SAME_IPS = "DEL, ADD asking for the same IPs, FINALIZE (the pod: repaired)"
DELETE_POD = "nothing, if repaired; if reported broken, what its code says (delete the pod)"


@dataclass(frozen=True)
class FindingDoc:
    kind: str  # an attachment's finding (AttachmentVerdict.finding) or a pod's broken code
    what: str
    noticed: str
    repair: str
    admin: str


FINDINGS = (
    FindingDoc("ok", "the attachment is what nri-cni recorded", ROUND, "nothing", "nothing"),
    FindingDoc("netns-gone", "the pod's netns is gone and the runtime tore the pod down", "the reaper (status.interval) and GC",
               "DEL (IPs released): the pod is gone", "nothing"),
    FindingDoc("link-missing", "no interface of that name in the pod's netns", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("host-link-missing", "a host-side link of the result (bridge, veth) is gone", ROUND, REPAIR_SAME_IPS,
               DELETE_POD),
    FindingDoc("port-detached", "the host veth is no port of the result's bridge (bridge made again)", ROUND,
               REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("mac-changed", "same name, another MAC: someone made a new link", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("link-down", "the interface is administratively down", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("no-carrier", "up without carrier (its peer is down)", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("address-missing", "an address of the result is not on the interface", ROUND, REPAIR_SAME_IPS,
               DELETE_POD),
    FindingDoc("address-extra", "a static global address nobody expected", ROUND, REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("route-missing", "a route of the result is not in the pod's netns through its interface", ROUND,
               REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("dnat-missing", "portmap's DNAT rule for a hostPort is gone (iptables or nft; a firewall reload)",
               ROUND + " (the rules are read once a round for every pod)", REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("lease-missing", "host-local's lease file of an address is gone, or names another container (the "
               "address could be handed out twice)", ROUND + " (the leases are read once a round)",
               REPAIR_SAME_IPS + "; if another pod holds the address: broken ip-taken", DELETE_POD),
    FindingDoc("unreadable", "the pod's netns, its routes, the host's links, DNAT rules or leases could not be "
               "read: not verified, never ok",
               ROUND + "; read again every round", "nothing (never on a guess); the pod: broken unreadable",
               "if it stays: the daemon log says what failed; delete the pod"),
    FindingDoc("no-result", "nri-cni's cache entry holds no result: nothing to compare with", ROUND,
               "nothing (the IPs are unknown); the pod: broken unreadable", "delete the pod"),
    FindingDoc("bad-result", "the cached result cannot be read", ROUND,
               "nothing (the IPs are unknown); the pod: broken unreadable", "delete the pod"),
    FindingDoc("check-failed", "the chain's CNI CHECK failed (what netlink cannot judge)",
               "every verify.check_every rounds (5 min), at once when netlink finds a difference, "
               "nri-cni verify --check", REPAIR_SAME_IPS, DELETE_POD),
    FindingDoc("missing", "a network the pod should have is not attached", ROUND,
               "ADD it (shim, secondary; native only with IPs the runtime lists); else broken missed",
               DELETE_POD),
    FindingDoc("netns-unreadable", "the runtime lists the pod and its pause runs, but its netns path is gone or "
               "no network namespace", ROUND, "nothing: nothing is released, its IPs stay held (broken "
               "netns-unreadable)", "delete the pod; its networks are released when the runtime drops it"),
)  # fmt: skip
BROKEN_CODES = (
    FindingDoc("ip-taken", "the IP the pod must get back belongs to another pod", ROUND,
               "never takes it", "delete the pod (it gets a new IP)"),
    FindingDoc("repair-failed", "repairs kept failing (retried with backoff)", "after 3 failed repairs",
               "retried with backoff", "fix what the error names, then nri-cni verify --pod, or delete the pod"),
    FindingDoc("missed", "native mode: the runtime made the pod without nri-cni's answer (down, killed, or "
               "answered past the NRI request timeout)", "at once for a late answer; else the verify after "
               "Synchronize", "releases what a late answer attached; attaches nothing the runtime would not "
               "report", "delete the pod; for the deadline, raise the runtime's plugin_request_timeout"),
    FindingDoc("repair-off", "it differs and repair is off or verify-only", ROUND, "nothing",
               "repair it by hand, set repair: on, or delete the pod"),
    FindingDoc("netns-unreadable", "see the finding of that name", ROUND, "nothing", "delete the pod"),
    FindingDoc("unreadable", "part of what the pod needs could not be read or compared", ROUND,
               "nothing; read again every round", "if it stays: the daemon log; delete the pod"),
)  # fmt: skip


def kinds_table() -> str:
    """`nri-cni verify --kinds`: every attachment finding, then every broken code."""
    rows = [("FINDING", "WHAT", "NOTICED", "REPAIR", "ADMIN")]
    rows += [(f.kind, f.what, f.noticed, f.repair, f.admin) for f in FINDINGS]
    rows += [("BROKEN CODE", "", "", "", "")]
    rows += [(f.kind, f.what, f.noticed, f.repair, f.admin) for f in BROKEN_CODES]
    return "\n".join(" | ".join(r) for r in rows)


def _label(pod_id: str, namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if name else pod_id[:12]


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, as kubectl prints them."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
