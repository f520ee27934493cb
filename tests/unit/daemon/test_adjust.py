"""container_adjustment (nri_cni/daemon/adjust.py): a table of pods' network-status lists and
settings, each with what a container gets and what is refused. Each refusal row has its control
row: the same input with the one value made acceptable, which the container then gets."""

from __future__ import annotations

import json

import pytest

from nri_cni.config.model import ContainerSettings, NetworkContainers
from nri_cni.daemon import adjust
from nri_cni.daemon.adjust import (
    MAX_TOTAL_BYTES,
    MAX_VALUE_BYTES,
    METADATA_PREFIX,
    NETWORK_STATUS_ANNOTATION,
    STATUS_MOUNT,
    container_adjustment,
)

POD_DIR = "/var/lib/nri-cni/containers/p1"
ALLOWED = ContainerSettings(socket_dirs=("/run/vhost",))
# a symlink in the test's world: /run/vhost/link -> /etc
LINKS = {"/run/vhost/link": "/etc"}


def resolve(path: str) -> str:
    for link, target in LINKS.items():
        if path == link or path.startswith(link + "/"):
            return target + path[len(link) :]
    return path


def eth0() -> dict:
    return {
        "name": "podnet",
        "interface": "eth0",
        "ips": ["10.1.0.5"],
        "mac": "0a:00:00:00:00:01",
        "default": True,
        "dns": {},
    }


def net1(metadata: dict | None = None, socket: str = "", pci: str = "") -> dict:
    element: dict = {"name": "fastnet", "interface": "net1", "ips": ["10.2.0.5"], "dns": {}}
    if socket:
        element["device-info"] = {"type": "vhost-user", "version": "1.1.0", "vhost-user": {"path": socket}}
    if pci:
        element["device-info"] = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci}}
    if metadata is not None:
        element["metadata"] = metadata
    return element


def build(elements, settings=ContainerSettings(), per_network=None):
    status = [(e["name"], e) for e in elements]
    return container_adjustment(status, settings, per_network or {}, pod_dir=POD_DIR, resolve=resolve)


def meta_annotations(adj) -> dict:
    return {k: v for k, v in adj.annotations.items() if k != NETWORK_STATUS_ANNOTATION}


def refused(adj) -> list[tuple[str, str]]:
    return [(r.reason, r.what) for r in adj.refusals]


FILE_MOUNT = adjust.Mount(POD_DIR, STATUS_MOUNT, ("rbind", "ro", "nosuid", "nodev", "noexec"))

# (case, metadata of net1, refused (reason, key), metadata annotations the container gets)
METADATA_CASES = [
    ("namespaced key", {"example.com/vf": "3"}, [], {"example.com/vf": "3"}),
    ("no domain", {"vf": "3"}, [(adjust.KEY_NOT_NAMESPACED, "vf")], {}),
    ("control: with a domain", {"a.io/vf": "3"}, [], {"a.io/vf": "3"}),
    ("empty domain", {"/vf": "3"}, [(adjust.KEY_NOT_NAMESPACED, "/vf")], {}),
    ("two slashes", {"a.io/b/c": "3"}, [(adjust.KEY_NOT_NAMESPACED, "a.io/b/c")], {}),
    ("upper-case domain", {"A.io/vf": "3"}, [(adjust.KEY_NOT_NAMESPACED, "A.io/vf")], {}),
    ("reserved cni.dev", {"cni.dev/x": "1"}, [(adjust.KEY_RESERVED, "cni.dev/x")], {}),
    ("reserved sub.cni.dev", {"a.cni.dev/x": "1"}, [(adjust.KEY_RESERVED, "a.cni.dev/x")], {}),
    ("control: notcni.dev", {"notcni.dev/x": "1"}, [], {"notcni.dev/x": "1"}),
    ("name too long", {"a.io/" + "n" * 64: "1"}, [(adjust.KEY_TOO_LONG, "a.io/" + "n" * 64)], {}),
    ("control: name of 63", {"a.io/" + "n" * 63: "1"}, [], {"a.io/" + "n" * 63: "1"}),
    ("domain too long", {"a" * 254 + "/x": "1"}, [(adjust.KEY_TOO_LONG, "a" * 254 + "/x")], {}),
    ("value too large", {"a.io/v": "x" * (MAX_VALUE_BYTES + 1)}, [(adjust.VALUE_TOO_LARGE, "a.io/v")], {}),
    ("control: value at the cap", {"a.io/v": "x" * MAX_VALUE_BYTES}, [], {"a.io/v": "x" * MAX_VALUE_BYTES}),
    (
        "multibyte value over the cap in bytes",
        {"a.io/v": "é" * (MAX_VALUE_BYTES // 2 + 1)},
        [(adjust.VALUE_TOO_LARGE, "a.io/v")],
        {},
    ),
]


@pytest.mark.parametrize(
    ("metadata", "refusals", "annotations"),
    [c[1:] for c in METADATA_CASES],
    ids=[c[0] for c in METADATA_CASES],
)
def test_metadata_keys_and_values(metadata, refusals, annotations):
    adj = build([eth0(), net1(metadata)])
    assert refused(adj) == refusals
    assert meta_annotations(adj) == {f"{METADATA_PREFIX}net1/{k}": v for k, v in annotations.items()}
    shown = json.loads(adj.annotations[NETWORK_STATUS_ANNOTATION])
    assert shown[1].get("metadata", {}) == annotations  # the refused value is out of the JSON too
    assert adj.status == shown  # the file says what the annotation says
    assert FILE_MOUNT in adj.mounts  # a refusal never costs the rest


def test_the_total_stays_within_kubernetes_annotation_budget():
    many = {f"a.io/k{i}": "x" * (MAX_VALUE_BYTES - 10) for i in range(40)}  # ~2 x 160 KiB wanted
    adj = build([eth0(), net1(many)])
    total = sum(len(k) + len(v) for k, v in adj.annotations.items())
    assert total <= MAX_TOTAL_BYTES
    reasons = {r.reason for r in adj.refusals}
    assert reasons == {adjust.TOTAL_TOO_LARGE}
    kept = meta_annotations(adj)
    assert 0 < len(kept) < 40 and len(kept) + len(adj.refusals) == 40
    # control: half as many fit whole
    few = dict(list(many.items())[: len(kept) - 1])
    assert build([eth0(), net1(few)]).refusals == ()


# (case, socketPath, settings, refused reason or "", socket mount expected)
SOCKET_CASES = [
    ("allowed dir", "/run/vhost/p1/sock", ALLOWED, "", "/run/vhost/p1"),
    ("allowed dir itself", "/run/vhost/sock", ALLOWED, "", "/run/vhost"),
    ("outside", "/var/run/other/sock", ALLOWED, adjust.SOCKET_NOT_ALLOWED, ""),
    ("prefix is not a parent", "/run/vhostile/sock", ALLOWED, adjust.SOCKET_NOT_ALLOWED, ""),
    ("no allowed dir (default)", "/run/vhost/p1/sock", ContainerSettings(), adjust.SOCKET_NOT_ALLOWED, ""),
    ("dotdot", "/run/vhost/../../etc/sock", ALLOWED, adjust.SOCKET_DOTDOT, ""),
    ("control: no dotdot", "/run/vhost/etc/sock", ALLOWED, "", "/run/vhost/etc"),
    ("not normalized", "/run/vhost//p1/sock", ALLOWED, adjust.SOCKET_DOTDOT, ""),
    ("relative", "run/vhost/p1/sock", ALLOWED, adjust.SOCKET_NOT_ABSOLUTE, ""),
    ("symlink out", "/run/vhost/link/sock", ALLOWED, adjust.SOCKET_SYMLINK, ""),
    ("control: beside the symlink", "/run/vhost/real/sock", ALLOWED, "", "/run/vhost/real"),
    (
        "sockets off globally",
        "/run/vhost/p1/sock",
        ContainerSettings(sockets=False, socket_dirs=("/run/vhost",)),
        "",
        "",
    ),
]


@pytest.mark.parametrize(
    ("path", "settings", "reason", "mounted"), [c[1:] for c in SOCKET_CASES], ids=[c[0] for c in SOCKET_CASES]
)
def test_socket_directories(path, settings, reason, mounted):
    adj = build([eth0(), net1(socket=path)], settings)
    assert refused(adj) == ([(reason, path)] if reason else [])
    sockets = [m for m in adj.mounts if m.destination != STATUS_MOUNT]
    if mounted:
        assert sockets == [adjust.Mount(mounted, mounted, ("rbind", "rw", "nosuid", "nodev", "noexec"))]
    else:
        assert sockets == []
    # the device-info stays in the status either way: it is data, the mount is what is refused
    assert adj.status is not None and adj.status[1]["device-info"]["vhost-user"]["path"] == path


def test_pci_device_info_is_carried_and_mounts_nothing():
    adj = build([eth0(), net1(pci="0000:03:00.1")], ALLOWED)
    assert adj.status is not None and adj.status[1]["device-info"]["pci"]["pci-address"] == "0000:03:00.1"
    assert adj.mounts == (FILE_MOUNT,)


def test_switches_global_and_per_network():
    elements = [eth0(), net1({"a.io/k": "v"}, socket="/run/vhost/p1/sock")]
    everything = build(elements, ALLOWED)
    assert set(everything.annotations) == {NETWORK_STATUS_ANNOTATION, f"{METADATA_PREFIX}net1/a.io/k"}
    assert len(everything.mounts) == 2 and everything.status is not None

    no_annotations = build(elements, ContainerSettings(annotations=False, socket_dirs=("/run/vhost",)))
    assert no_annotations.annotations == {} and no_annotations.status is not None

    no_file = build(elements, ContainerSettings(file=False, socket_dirs=("/run/vhost",)))
    assert no_file.status is None and FILE_MOUNT not in no_file.mounts and no_file.annotations

    # per network: fastnet keeps out of the annotations and its socket is not mounted
    per = {"fastnet": NetworkContainers(annotations=False, sockets=False)}
    quiet = build(elements, ALLOWED, per)
    shown = json.loads(quiet.annotations[NETWORK_STATUS_ANNOTATION])
    assert [e["interface"] for e in shown] == ["eth0"]
    assert meta_annotations(quiet) == {}
    assert quiet.mounts == (FILE_MOUNT,)
    assert quiet.status is not None and [e["interface"] for e in quiet.status] == ["eth0", "net1"]

    # every network's file off: no file even with the global switch on
    off = {"podnet": NetworkContainers(file=False), "fastnet": NetworkContainers(file=False)}
    assert build(elements, ALLOWED, off).status is None


def test_a_pod_without_attachments_gets_nothing():
    adj = build([])
    assert adj.empty and adj.refusals == ()


def test_key_problem_is_the_table_rule():
    assert adjust.key_problem("example.com/vf") == ""
    assert adjust.key_problem("example.com/") == adjust.KEY_NOT_NAMESPACED
    assert adjust.key_problem("k8s.v1.cni.cncf.io/x") == ""
