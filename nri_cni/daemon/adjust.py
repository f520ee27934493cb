"""What a container of a pod with nri-cni's networks gets at NRI CreateContainer: a decision.

`container_adjustment` takes the pod's network-status list (podreport.py, the one
`nri-cni pods -o json` shows), the CNI network each element came from, and the settings
(`containers:` globally and per network, config/model.py); it returns the annotations, the
mounts, the JSON for the pod's status file and what it refused, and touches nothing (the
symlink check asks the `resolve` function it is given). docs/containers.md is the user's view.

Metadata comes from plugins and, through them, from pod annotations: a key must be namespaced
(`domain/name`, a Kubernetes qualified name), `cni.dev/` is CNI's own, a value has a size cap,
and everything nri-cni adds stays within Kubernetes' annotation budget. A socketPath is mounted
only when its directory, symlinks resolved, lies under a directory the admin allowed. A refused
value is left out; the container is created without it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from nri_cni.config.model import ContainerSettings, NetworkContainers

NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
# one annotation per metadata key: nri-cni.io/<interface>/<key>, e.g. nri-cni.io/net1/example.com/vf
METADATA_PREFIX = "nri-cni.io/"
STATUS_MOUNT = "/run/nri-cni"  # the per-pod directory's place in the container
STATUS_FILE = "network-status.json"
RESERVED_DOMAIN = "cni.dev"

MAX_KEY_PREFIX = 253  # a DNS subdomain
MAX_KEY_NAME = 63
MAX_VALUE_BYTES = 4096
MAX_TOTAL_BYTES = 256 * 1024  # Kubernetes' cap on a pod's annotations, keys and values together
MAX_SOCKET_PATH = 4095

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

# refusal reasons (the metric's `reason` label)
KEY_NOT_NAMESPACED = "key-not-namespaced"
KEY_TOO_LONG = "key-too-long"
KEY_RESERVED = "key-reserved"
VALUE_TOO_LARGE = "value-too-large"
TOTAL_TOO_LARGE = "total-too-large"
SOCKET_NOT_ABSOLUTE = "socket-not-absolute"
SOCKET_DOTDOT = "socket-dotdot"
SOCKET_SYMLINK = "socket-symlink"
SOCKET_NOT_ALLOWED = "socket-not-allowed"
REASONS = (
    KEY_NOT_NAMESPACED,
    KEY_TOO_LONG,
    KEY_RESERVED,
    VALUE_TOO_LARGE,
    TOTAL_TOO_LARGE,
    SOCKET_NOT_ABSOLUTE,
    SOCKET_DOTDOT,
    SOCKET_SYMLINK,
    SOCKET_NOT_ALLOWED,
)


@dataclass(frozen=True)
class Mount:
    source: str
    destination: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class Refusal:
    reason: str  # one of REASONS
    interface: str
    what: str  # the key, or the socket path, as given (quoted by the caller's log)


@dataclass(frozen=True)
class Adjustment:
    annotations: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    status: list[dict] | None = None  # the status file's list; None: no file
    refusals: tuple[Refusal, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.annotations and not self.mounts and self.status is None


def key_problem(key: str) -> str:
    """Why a metadata key is refused ("" when it is fine)."""
    prefix, slash, name = key.partition("/")
    if not slash or not prefix:
        return KEY_NOT_NAMESPACED
    if len(prefix) > MAX_KEY_PREFIX or len(name) > MAX_KEY_NAME:
        return KEY_TOO_LONG
    if not _PREFIX.fullmatch(prefix) or not _NAME.fullmatch(name):
        return KEY_NOT_NAMESPACED
    if prefix == RESERVED_DOMAIN or prefix.endswith("." + RESERVED_DOMAIN):
        return KEY_RESERVED
    return ""


def socket_problem(path: str, allowed_dirs: Sequence[str], resolve: Callable[[str], str]) -> str:
    """Why the directory of a socketPath may not be mounted ("" when it may). `resolve`:
    os.path.realpath; the allowed dirs are taken as resolved by the caller."""
    if not path.startswith("/") or len(path) > MAX_SOCKET_PATH:
        return SOCKET_NOT_ABSOLUTE
    if ".." in path.split("/") or os.path.normpath(path) != path:
        return SOCKET_DOTDOT
    directory = os.path.dirname(path)
    if resolve(directory) != directory:
        return SOCKET_SYMLINK
    if not any(directory == d or directory.startswith(d.rstrip("/") + "/") for d in allowed_dirs):
        return SOCKET_NOT_ALLOWED
    return ""


def container_adjustment(
    status: Sequence[tuple[str, Mapping]],
    settings: ContainerSettings,
    per_network: Mapping[str, NetworkContainers],
    *,
    pod_dir: str,
    resolve: Callable[[str], str],
) -> Adjustment:
    """`status`: (CNI network name, network-status element) per interface of the pod, in the
    report's order; `per_network`: each network's own switches (a network not named: all on);
    `pod_dir`: the pod's directory on the host (mounted at STATUS_MOUNT)."""
    refusals: list[Refusal] = []
    elements: list[dict] = []
    keys: list[tuple[str, str, str]] = []  # (interface, key, value) kept
    for _network, element in status:
        out = {k: v for k, v in element.items() if k != "metadata"}
        elements.append(out)
    used = _json_len(elements) + len(NETWORK_STATUS_ANNOTATION)
    for (_network, element), out in zip(status, elements, strict=True):
        ifname = str(element.get("interface", ""))
        kept: dict[str, str] = {}
        for key, value in dict(element.get("metadata") or {}).items():
            problem = key_problem(key) or (VALUE_TOO_LARGE if len(value.encode()) > MAX_VALUE_BYTES else "")
            if not problem:
                # in the JSON (annotation and file count once: the file is not an annotation)
                # and as an annotation of its own
                cost = len(json.dumps(key)) + len(json.dumps(value)) + 2 + (0 if kept else 13)
                cost += len(METADATA_PREFIX) + len(ifname) + 1 + len(key) + len(value)
                if used + cost > MAX_TOTAL_BYTES:
                    problem = TOTAL_TOO_LARGE
                else:
                    used += cost
            if problem:
                refusals.append(Refusal(problem, ifname, key))
                continue
            kept[key] = value
            keys.append((ifname, key, value))
        if kept:
            out["metadata"] = kept

    annotations: dict[str, str] = {}
    wants = [(network, per_network.get(network, NetworkContainers())) for network, _ in status]
    if settings.annotations and any(w.annotations for _, w in wants):
        shown = [e for e, (_, w) in zip(elements, wants, strict=True) if w.annotations]
        annotations[NETWORK_STATUS_ANNOTATION] = json.dumps(shown, separators=(",", ":"))
        on = {str(e.get("interface", "")) for e in shown}
        for ifname, key, value in keys:
            if ifname in on:
                annotations[f"{METADATA_PREFIX}{ifname}/{key}"] = value

    mounts: list[Mount] = []
    file_status: list[dict] | None = None
    if settings.file and any(w.file for _, w in wants):
        file_status = [e for e, (_, w) in zip(elements, wants, strict=True) if w.file]
        mounts.append(Mount(pod_dir, STATUS_MOUNT, ("rbind", "ro", "nosuid", "nodev", "noexec")))

    if settings.sockets:
        allowed = [resolve(d) for d in settings.socket_dirs]
        seen: set[str] = set()
        for (_network, element), (_, want) in zip(status, wants, strict=True):
            path = _socket_path(element)
            if not path or not want.sockets:
                continue
            problem = socket_problem(path, allowed, resolve)
            if problem:
                refusals.append(Refusal(problem, str(element.get("interface", "")), path))
                continue
            directory = os.path.dirname(path)
            if directory not in seen:
                seen.add(directory)
                mounts.append(Mount(directory, directory, ("rbind", "rw", "nosuid", "nodev", "noexec")))
    return Adjustment(annotations, tuple(mounts), file_status, tuple(refusals))


def status_json(status: list[dict]) -> bytes:
    """The status file's bytes: the same list as the annotation, indented for a reader."""
    return (json.dumps(status, indent=2) + "\n").encode()


def _socket_path(element: Mapping) -> str:
    device = element.get("device-info")
    if not isinstance(device, Mapping) or device.get("type") != "vhost-user":
        return ""
    inner = device.get("vhost-user")
    return str(inner.get("path", "")) if isinstance(inner, Mapping) else ""


def _json_len(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":")))
