"""Which networks a pod gets: the admin's defaults plus what its annotation may ask for.

The Multus selection annotation `k8s.v1.cni.cncf.io/networks` is written by whoever can edit the
pod, so it is untrusted input: it may only name networks the admin configured and allowed for the
pod's namespace, never a file, a plugin or a conf dir; interface names, IPs and MACs in it are
validated before anything runs. A refused annotation refuses the whole pod (nothing attached),
which is what a Multus user expects from a bad NetworkAttachmentDefinition reference.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from nri_cni.config import Config, NetworkSpec, nad
from nri_cni.errors import AnnotationRefused
from nri_cni.pod.model import PrimaryNetwork
from nri_cni.safety import jsonlimits, validate

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_REQUESTED_NETWORKS = 32

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
# Keys of a JSON selection element that nri-cni understands; anything else is refused rather
# than silently ignored, so a user never believes an option took effect when it did not.
_JSON_KEYS = {"name", "namespace", "interface", "ips", "mac"}


@dataclass(frozen=True)
class Selected:
    """One network to attach to a pod, in attachment order."""

    network: NetworkSpec
    ifname: str
    capability_args: dict[str, Any] = field(default_factory=dict)  # ips / mac asked for by the pod

    @property
    def key(self) -> tuple[str, str]:
        """The attachment it makes: (network, ifname)."""
        return (self.network.name, self.ifname)


def select_networks(
    cfg: Config,
    namespace: str,
    annotations: dict[str, str],
    *,
    primary: PrimaryNetwork = PrimaryNetwork("", ours=True),
) -> list[Selected]:
    """The pod's networks in order: default networks (the primary first), then the
    annotation's requests.

    `primary` (from the mode): ours, it is attached first, as eth0; not ours (secondary mode),
    it is the runtime's network, skipped, and eth0 is the runtime's too.
    Interface names are the network's configured one, else eth0 for the first, then net1, net2...
    """
    requests = parse_annotation(annotations.get(NETWORKS_ANNOTATION, ""))
    chosen = _defaults(cfg, primary) + _requested(cfg, namespace, requests)
    out = _named(chosen, primary)
    try:
        validate.check_selection(
            [sel.network.name for sel in out],
            max_networks=cfg.limits.networks_per_pod,
            max_per_network=cfg.limits.attachments_per_network,
            where=NETWORKS_ANNOTATION,
        )
    except validate.InvalidInput as exc:
        raise AnnotationRefused(exc.msg) from None
    return out


_Chosen = tuple[NetworkSpec, str, dict[str, Any]]  # a network, its interface ("" = not named yet), caps


def _defaults(cfg: Config, primary: PrimaryNetwork) -> list[_Chosen]:
    """The default networks, the primary first when it is ours, left out when it is not."""
    chosen: list[_Chosen] = []
    for default in cfg.default_networks:
        if default.name == primary.name and not primary.ours:
            continue
        entry: _Chosen = (default, default.interface, {})
        if default.name == primary.name:
            chosen.insert(0, entry)
        else:
            chosen.append(entry)
    return chosen


def _requested(cfg: Config, namespace: str, requests: list[_Request]) -> list[_Chosen]:
    """The annotation's requests, each checked against the config and the pod's namespace."""
    chosen: list[_Chosen] = []
    for i, req in enumerate(requests):
        where = f"{NETWORKS_ANNOTATION}[{i}]"
        if req.namespace and req.namespace != namespace:
            raise AnnotationRefused(
                f"{where}: network {req.namespace}/{req.name} is in another namespace; a pod may "
                f"only ask for networks of its own namespace ({namespace!r})"
            )
        net = nad.lookup(cfg.networks, namespace, req.name)
        if net is None or not net.allowed_in(namespace):
            raise AnnotationRefused(
                f"{where}: network {req.name!r} is not allowed for pods in namespace {namespace!r}"
            )
        if net.default:
            raise AnnotationRefused(f"{where}: network {req.name!r} is attached to every pod already")
        chosen.append((net, req.interface or net.interface, req.capability_args))
    return chosen


def _named(chosen: list[_Chosen], primary: PrimaryNetwork) -> list[Selected]:
    """Each network with its interface: the one given, else eth0 for our primary, then net1..."""
    # The primary network (first, when it is ours) is eth0 unless the admin named its
    # interface: reserve that name before any request can take it.
    if chosen and not chosen[0][1] and primary.ours:
        chosen[0] = (chosen[0][0], "eth0", chosen[0][2])
    out: list[Selected] = []
    used = {ifname for _, ifname, _ in chosen if ifname}
    counter = 0
    for net, ifname, caps in chosen:
        if not ifname:
            counter += 1
            while f"net{counter}" in used:
                counter += 1
            ifname = f"net{counter}"  # counter only grows: never made twice
        out.append(Selected(network=net, ifname=ifname, capability_args=caps))
    seen: set[str] = set()
    for sel in out:
        if sel.ifname in seen:
            raise AnnotationRefused(f"{NETWORKS_ANNOTATION}: interface {sel.ifname!r} is requested twice")
        seen.add(sel.ifname)
    if not primary.ours and "eth0" in seen:
        raise AnnotationRefused(f"{NETWORKS_ANNOTATION}: eth0 belongs to the runtime's own network")
    return out


@dataclass(frozen=True)
class _Request:
    name: str
    namespace: str = ""
    interface: str = ""
    capability_args: dict[str, Any] = field(default_factory=dict)


def parse_annotation(value: str) -> list[_Request]:
    """Parses both Multus forms: `[ns/]name[@ifname], ...` or a JSON list of objects."""
    if not value or not value.strip():
        return []
    if len(value.encode()) > MAX_ANNOTATION_BYTES:
        raise AnnotationRefused(f"{NETWORKS_ANNOTATION} is larger than {MAX_ANNOTATION_BYTES} bytes")
    text = value.strip()
    if text.startswith("["):
        requests = _parse_json(text)
    else:
        requests = [_parse_short(item.strip(), i) for i, item in enumerate(text.split(","))]
    if len(requests) > MAX_REQUESTED_NETWORKS:
        raise AnnotationRefused(f"{NETWORKS_ANNOTATION} asks for more than {MAX_REQUESTED_NETWORKS} networks")
    return requests


def _parse_short(item: str, i: int) -> _Request:
    where = f"{NETWORKS_ANNOTATION}[{i}]"
    if not item:
        raise AnnotationRefused(f"{where}: empty network reference")
    ref, _, ifname = item.partition("@")
    namespace, _, name = ref.rpartition("/")
    _check_name(name, where, "network name")
    if namespace:
        _check_name(namespace, where, "namespace")
    if "@" in item:
        _check_ifname(ifname, where)
    return _Request(name=name, namespace=namespace, interface=ifname)


def _parse_json(text: str) -> list[_Request]:
    try:
        items = jsonlimits.loads(text, max_bytes=MAX_ANNOTATION_BYTES)
    except ValueError as exc:
        raise AnnotationRefused(f"{NETWORKS_ANNOTATION} is not valid JSON: {exc}") from None
    # JSON text that starts with "[" (parse_annotation's test) is a list when it parses at all
    out = []
    for i, obj in enumerate(items):
        where = f"{NETWORKS_ANNOTATION}[{i}]"
        if not isinstance(obj, dict):
            raise AnnotationRefused(f"{where}: each element must be an object")
        unknown = set(obj) - _JSON_KEYS
        if unknown:
            raise AnnotationRefused(
                f"{where}: unsupported key(s) {validate.shown(', '.join(sorted(map(str, unknown))))} "
                f"(supported: {', '.join(sorted(_JSON_KEYS))})"
            )
        name = obj.get("name")
        namespace = obj.get("namespace", "")
        ifname = obj.get("interface", "")
        if not isinstance(name, str) or not isinstance(namespace, str) or not isinstance(ifname, str):
            raise AnnotationRefused(f"{where}: name, namespace and interface must be strings")
        _check_name(name, where, "network name")
        if namespace:
            _check_name(namespace, where, "namespace")
        if ifname:
            _check_ifname(ifname, where)
        caps: dict[str, Any] = {}
        if "ips" in obj:
            caps["ips"] = _check_ips(obj["ips"], where)
        if "mac" in obj:
            mac = obj["mac"]
            if not isinstance(mac, str) or not _MAC.fullmatch(mac):
                raise AnnotationRefused(f"{where}: mac {validate.quote(mac)} is not a MAC address")
            caps["mac"] = mac
        out.append(_Request(name=name, namespace=namespace, interface=ifname, capability_args=caps))
    return out


def _check_name(name: str, where: str, what: str) -> None:
    if not name or len(name) > 253 or not _NAME.fullmatch(name):
        raise AnnotationRefused(
            f"{where}: {what} {validate.quote(name)} is not valid (letters, digits, '_', '.', '-'; no path)"
        )


def _check_ifname(ifname: str, where: str) -> None:
    problem = validate.ifname_problem(ifname)
    if problem:
        raise AnnotationRefused(
            f"{where}: interface name {validate.quote(ifname)} {problem} "
            "(1-15 bytes, no '/', ':', whitespace or control characters)"
        )


def _check_ips(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 16:
        raise AnnotationRefused(f"{where}: ips must be a list of at most 16 strings")
    for ip in value:
        try:
            ipaddress.ip_interface(ip)
        except ValueError:
            raise AnnotationRefused(f"{where}: {validate.quote(ip)} is not an IP address") from None
    return list(value)
