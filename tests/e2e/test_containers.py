"""Real containers learn their pod's networks (docs/containers.md), through NRI CreateContainer.

On containerd 2.1.9 and CRI-O 1.36.3 (where installed), in shim and in secondary mode: a pod
with macvlan networks whose chain ends in tests/plugins/meta_plugin.py (metadata and a
vhost-user socketPath, as a vhost-user plugin would give). A busybox container
(tests/support/busybox.py) `cat`s /run/nri-cni/network-status.json; the test compares it with
`nri-cni pods -o json`, and the runtime's OCI spec (CRI ContainerStatus verbose info) with the
annotations. A socket directory under `containers.socket_dirs` is mounted; one outside, one
through `..`, and metadata keys that are not namespaced or are `cni.dev/` are refused: the
container is created all the same, the log says why once per pod, the counter counts. After a
repair that gives net1 a new MAC, the running container reads the new MAC; a container created
after nri-cni restarted gets the same. Nothing is left of the pods' directories."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import uuid

import pytest

from nri_cni.local import proto as localproto
from tests.support.bin_dir import install_test_plugin
from tests.support.busybox import BUSYBOX, build_busybox_image
from tests.support.crionode import runtime_node  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

STATUS = "/run/nri-cni/network-status.json"
NS = "nct-e2e"
STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"


@pytest.fixture(scope="module")
def busybox():
    return build_busybox_image()


def _macvlan(node, name: str, part: int, meta: dict) -> dict:
    """A macvlan network ending in the metadata plugin; each its own quarter of net1's /24."""
    net = ipaddress.ip_network(node.net1_subnet)
    first = net.network_address + 64 * part
    ranges = [[{"subnet": str(net), "rangeStart": str(first + 2), "rangeEnd": str(first + 62)}]]
    return {
        "name": name,
        "namespaces": [NS],
        "conflist": {
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [
                {
                    "type": "macvlan",
                    "master": node.master,
                    "mode": "bridge",
                    "ipam": {"type": "host-local", "dataDir": str(node.setup.ipam_dir), "ranges": ranges},
                },
                {"type": "nct-meta", **meta},
            ],
        },
    }


def _networks(node, allowed, outside) -> list[dict]:
    return [
        _macvlan(
            node,
            "fastnet",
            0,
            {
                "metadata": {"example.com/vf": "3", "vf": "bad", "cni.dev/network": "mine"},
                "socketPath": str(allowed / "vu" / "sock"),
            },
        ),
        _macvlan(node, "outnet", 1, {"socketPath": str(outside / "sock")}),
        _macvlan(node, "dotnet", 2, {"socketPath": f"{allowed}/../outside/sock"}),
    ]


def _scrape(path: str) -> dict[str, float]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    out = {}
    for line in data.decode().split("\r\n\r\n", 1)[1].splitlines():
        if line.startswith("nri_cni_container_refusals_total{"):
            name, value = line.rsplit(" ", 1)
            out[name.split('reason="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def _container(rt, pod_id: str, sandbox, image: str) -> str:
    cid = rt.cri.create_container(
        pod_id, sandbox, f"app-{uuid.uuid4().hex[:6]}", image, [BUSYBOX, "sleep", "100000"]
    )
    rt.cri.start_container(cid)
    return cid


def _read_status(rt, cid: str) -> list:
    code, out, err = rt.cri.exec_sync(cid, [BUSYBOX, "cat", STATUS])
    assert code == 0, err
    return json.loads(out)


def _spec(rt, cid: str) -> dict:
    _state, info = rt.cri.container_status(cid)
    return info["info"]["runtimeSpec"]


def _pod(rt, name: str, networks: str):
    uid = str(uuid.uuid4())
    ann = {"k8s.v1.cni.cncf.io/networks": networks}
    pod_id = rt.cri.run_pod(name, NS, uid, annotations=ann)
    return pod_id, rt.cri.pod_config(name, NS, uid, annotations=ann)


def _report(daemon, pod_id: str) -> list:
    (pod,) = [p for p in daemon.pods() if p["id"] == pod_id]
    return pod["network-status"]


def _without_refused(status: list) -> list:
    """The report as a container sees it: the refused metadata keys left out."""
    out = json.loads(json.dumps(status))
    for element in out:
        if element.get("interface") == "net1" and "metadata" in element:
            element["metadata"] = {"example.com/vf": "3"}
    return out


@pytest.mark.parametrize("mode", ["shim", "secondary"])
def test_containers_read_their_pods_networks(runtime_node, mode, busybox):
    node = runtime_node
    install_test_plugin(node.setup.bin_dir, "meta_plugin", "nct-meta")
    allowed, outside = node.tmp / "vhost", node.tmp / "outside"
    (allowed / "vu").mkdir(parents=True)
    outside.mkdir()
    metrics = str(node.setup.sock_dir / "m.sock")
    extra = {"containers": {"socket_dirs": [str(allowed)]}, "metrics": {"listen": metrics}}
    nets = _networks(node, allowed, outside)
    if mode == "shim":
        rt = node.start_containerd()
        cfg = node.daemon_config([node.podnet(finalize=False), *nets], **extra)
        daemon = node.start_daemon(cfg)
        leaks = node.leak_checker().start()
    else:
        daemon = node.start_secondary(nets[0], **extra)
        cfg = daemon.cfg
        cfg["networks"] = [{**n, "default": False} for n in nets]
        daemon.stop()
        daemon = node.start_daemon(cfg)
        rt = node.ctd
        leaks = node.leak_checker()
        leaks.dirs.append(str(node.primary.ipam_dir))
        leaks.bridges.add(node.primary.bridge)
        leaks.start()
    rt.import_image(busybox.archive if node.runtime_name == "containerd" else busybox)
    if node.runtime_name == "containerd":
        rt._wait_image(busybox.ref)

    good, good_sandbox = _pod(rt, f"good-{uuid.uuid4().hex[:6]}", "fastnet")
    bad, bad_sandbox = _pod(rt, f"bad-{uuid.uuid4().hex[:6]}", "outnet,dotnet")
    leaks.add_markers(good, bad)

    # the file is the report (the runtime's eth0 in it too in secondary mode), minus the
    # refused metadata keys
    cid = _container(rt, good, good_sandbox, busybox.ref)
    seen = _read_status(rt, cid)
    report = _report(daemon, good)
    assert [e["interface"] for e in report] == ["eth0", "net1"]
    assert report[1]["metadata"] == {"example.com/vf": "3", "vf": "bad", "cni.dev/network": "mine"}
    assert seen == _without_refused(report)
    assert seen[1]["device-info"] == {
        "type": "vhost-user",
        "version": "1.1.0",
        "vhost-user": {"path": str(allowed / "vu" / "sock")},
    }
    # the OCI spec the runtime wrote carries the annotations and the mounts
    spec = _spec(rt, cid)
    annotations = spec["annotations"]
    assert json.loads(annotations[STATUS_ANNOTATION]) == seen
    assert annotations["nri-cni.io/net1/example.com/vf"] == "3"
    assert not any(k.startswith("nri-cni.io/net1/vf") or "cni.dev/" in k for k in annotations)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert "ro" in mounts["/run/nri-cni"]["options"]
    assert mounts[str(allowed / "vu")]["source"] == str(allowed / "vu")

    # the other pod: both sockets refused, its container created all the same, with the file
    bad_cid = _container(rt, bad, bad_sandbox, busybox.ref)
    assert [e["interface"] for e in _read_status(rt, bad_cid)] == ["eth0", "net1", "net2"]
    bad_mounts = {m["destination"] for m in _spec(rt, bad_cid)["mounts"]}
    assert str(outside) not in bad_mounts and str(allowed) not in bad_mounts
    log = daemon.log_path.read_text()
    lines = [ln for ln in log.splitlines() if "left out of its containers" in ln]
    (good_line,) = [ln for ln in lines if good in ln]
    assert "key-not-namespaced" in good_line and "key-reserved" in good_line
    (bad_line,) = [ln for ln in lines if bad in ln]
    assert "socket-not-allowed" in bad_line and "socket-dotdot" in bad_line
    counts = _scrape(metrics)
    assert counts == {"key-not-namespaced": 1, "key-reserved": 1, "socket-not-allowed": 1, "socket-dotdot": 1}

    # a repair gives net1 a new MAC: the running container reads it
    netns = rt.cri.pod_status(good).netns_path
    old_mac = seen[1]["mac"]
    subprocess.run(["nsenter", f"--net={netns}", "ip", "link", "del", "net1"], check=True)
    status, payload = localproto.call(
        daemon.socket,
        {localproto.OP_KEY: "verify"},
        json.dumps({"pod": good, "check": False}).encode(),
        timeout=120,
    )
    assert status == 0, payload
    after = _read_status(rt, cid)
    assert after[1]["mac"] != old_mac
    assert after == _without_refused(_report(daemon, good))

    # nri-cni restarted: a new container gets the same adjustment
    daemon.stop()
    daemon = node.start_daemon(cfg)
    cid2 = _container(rt, good, good_sandbox, busybox.ref)
    assert _read_status(rt, cid2) == after
    assert json.loads(_spec(rt, cid2)["annotations"][STATUS_ANNOTATION]) == after

    for pod in (good, bad):
        node.remove_pod(pod)
    assert rt.cri.list_containers() == []
    assert os.listdir(node.setup.state_dir / "containers") == []
    assert leaks.leaks() == []
