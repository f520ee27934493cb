"""Real containers learn their pod's networks (docs/containers.md), through NRI CreateContainer.

containerd 2.1.9 in shim mode: a pod with a bridge eth0 and macvlan networks whose chain ends in
tests/plugins/meta_plugin.py (metadata and a vhost-user socketPath, as a vhost-user plugin
would give). A busybox container (tests/support/busybox.py) `cat`s /run/nri-cni/network-status.json;
the test compares it with `nri-cni pods -o json` and the runtime's OCI spec (CRI ContainerStatus
verbose info) with the annotations. A socket directory under `containers.socket_dirs` is mounted;
one outside, one through `..`, and metadata keys that are not namespaced or are `cni.dev/` are
refused: the container is created all the same, the log says why once, the counter counts.
After a repair that gives net1 a new MAC, the running container reads the new MAC; a container
created after nri-cni restarted gets the same. Nothing is left of the pods' directories."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest

from nri_cni.local import proto as localproto
from tests.e2e.nricni import NriCni, ShimSetup
from tests.support.busybox import BUSYBOX, build_busybox_image
from tests.support.janitor import Janitor
from tests.support.leaks import LeakChecker
from tests.support.names import unique_name

pytestmark = pytest.mark.e2e

META_PLUGIN = os.path.join(os.path.dirname(__file__), "..", "plugins", "meta_plugin.py")
STATUS = "/run/nri-cni/network-status.json"
NS = "nct-e2e"


@pytest.fixture(scope="module")
def busybox():
    return build_busybox_image()


@pytest.fixture
def node(tmp_path, make_containerd, busybox):
    jan = Janitor()
    setup = ShimSetup(tmp_path)
    (setup.bin_dir / "nct-meta").write_text(
        f"#!{os.path.realpath(sys.executable)} -IS\n" + open(META_PLUGIN).read()
    )
    (setup.bin_dir / "nct-meta").chmod(0o755)
    n = type("Node", (), {})()
    n.jan, n.setup, n.tmp = jan, setup, tmp_path
    n.bridge = unique_name("br")
    jan.track_link(n.bridge)
    n.master, _ = jan.veth()
    n.allowed = tmp_path / "vhost"
    (n.allowed / "vu").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    n.metrics = str(setup.sock_dir / "m.sock")
    yield n
    for d in getattr(n, "daemons", []):
        if d.proc and d.proc.poll() is None:
            d.stop()
    failed = jan.cleanup()
    setup.cleanup()
    if failed:
        pytest.fail(f"cleanup: {failed}")


def _macvlan(n, name: str, subnet: str, meta: dict) -> dict:
    return {
        "name": name,
        "namespaces": [NS],
        "conflist": {
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [
                {
                    "type": "macvlan",
                    "master": n.master,
                    "mode": "bridge",
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(n.setup.ipam_dir),
                        "ranges": [[{"subnet": subnet}]],
                    },
                },
                {"type": "nct-meta", **meta},
            ],
        },
    }


def _config(n, ctd) -> dict:
    nets = [
        {
            "name": "podnet",
            "default": True,
            "conflist": {
                "cniVersion": "1.1.0",
                "name": "podnet",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": n.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(n.setup.ipam_dir),
                            "ranges": [[{"subnet": "10.246.60.0/24"}]],
                        },
                    }
                ],
            },
        },
        _macvlan(
            n,
            "fastnet",
            "10.246.61.0/24",
            {
                "metadata": {"example.com/vf": "3", "vf": "bad", "cni.dev/network": "mine"},
                "socketPath": str(n.allowed / "vu" / "sock"),
            },
        ),
        _macvlan(n, "outnet", "10.246.62.0/24", {"socketPath": str(n.tmp / "outside" / "sock")}),
        _macvlan(n, "dotnet", "10.246.63.0/24", {"socketPath": f"{n.allowed}/../outside/sock"}),
    ]
    return n.setup.config(
        ctd.nri_socket,
        nets,
        containers={"socket_dirs": [str(n.allowed)]},
        metrics={"listen": n.metrics},
    )


def _start_daemon(n, cfg) -> NriCni:
    d = NriCni(n.tmp, cfg).start()
    n.daemons = [*getattr(n, "daemons", []), d]
    return d


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


def _container(ctd, pod_id: str, sandbox, image: str) -> str:
    cid = ctd.cri.create_container(
        pod_id, sandbox, f"app-{uuid.uuid4().hex[:6]}", image, [BUSYBOX, "sleep", "100000"]
    )
    ctd.cri.start_container(cid)
    return cid


def _read_status(ctd, cid: str) -> list:
    code, out, err = ctd.cri.exec_sync(cid, [BUSYBOX, "cat", STATUS])
    assert code == 0, err
    return json.loads(out)


def _spec(ctd, cid: str) -> dict:
    _state, info = ctd.cri.container_status(cid)
    return info["info"]["runtimeSpec"]


def _pod(ctd, name: str, networks: str):
    uid = str(uuid.uuid4())
    ann = {"k8s.v1.cni.cncf.io/networks": networks}
    pod_id = ctd.cri.run_pod(name, NS, uid, annotations=ann)
    return pod_id, ctd.cri.pod_config(name, NS, uid, annotations=ann)


def _report(daemon: NriCni, pod_id: str) -> list:
    (pod,) = [p for p in daemon.pods() if p["id"] == pod_id]
    return pod["network-status"]


def test_containers_read_their_networks_in_containerd_shim_mode(node, make_containerd, busybox):
    n = node
    ctd = make_containerd(cni_conf_dir=n.setup.conf_dir, cni_bin_dirs=[n.setup.bin_dir])
    ctd.import_image(busybox.archive)
    ctd._wait_image(busybox.ref)
    cfg = _config(n, ctd)
    daemon = _start_daemon(n, cfg)
    leaks = LeakChecker(
        dirs=[n.setup.cache_dir, n.setup.ipam_dir, n.setup.state_dir], bridges=[n.bridge]
    ).start()

    good, good_sandbox = _pod(ctd, f"good-{uuid.uuid4().hex[:6]}", "fastnet")
    bad, bad_sandbox = _pod(ctd, f"bad-{uuid.uuid4().hex[:6]}", "outnet,dotnet")
    leaks.add_markers(good, bad)

    # the file is the report, minus the refused metadata keys
    cid = _container(ctd, good, good_sandbox, busybox.ref)
    seen = _read_status(ctd, cid)
    report = _report(daemon, good)
    assert report[1]["metadata"] == {"example.com/vf": "3", "vf": "bad", "cni.dev/network": "mine"}
    report[1]["metadata"] = {"example.com/vf": "3"}
    assert seen == report
    assert seen[1]["device-info"] == {
        "type": "vhost-user",
        "version": "1.1.0",
        "vhost-user": {"path": str(n.allowed / "vu" / "sock")},
    }
    # the OCI spec the runtime wrote carries the annotations and the mounts
    spec = _spec(ctd, cid)
    annotations = spec["annotations"]
    assert json.loads(annotations["k8s.v1.cni.cncf.io/network-status"]) == seen
    assert annotations["nri-cni.io/net1/example.com/vf"] == "3"
    assert not any(k.startswith("nri-cni.io/net1/vf") or "cni.dev/" in k for k in annotations)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert "ro" in mounts["/run/nri-cni"]["options"]
    assert mounts[str(n.allowed / "vu")]["source"] == str(n.allowed / "vu")

    # the other pod: both sockets refused, its container created all the same, with the file
    bad_cid = _container(ctd, bad, bad_sandbox, busybox.ref)
    assert [e["interface"] for e in _read_status(ctd, bad_cid)] == ["eth0", "net1", "net2"]
    bad_mounts = {m["destination"] for m in _spec(ctd, bad_cid)["mounts"]}
    assert str(n.tmp / "outside") not in bad_mounts and str(n.allowed) not in bad_mounts
    log = daemon.log_path.read_text()
    lines = [ln for ln in log.splitlines() if "left out of its containers" in ln]
    assert (
        len([ln for ln in lines if good in ln]) == 1 and "key-not-namespaced" in log and "key-reserved" in log
    )
    (bad_line,) = [ln for ln in lines if bad in ln]
    assert "socket-not-allowed" in bad_line and "socket-dotdot" in bad_line
    counts = _scrape(n.metrics)
    assert counts == {"key-not-namespaced": 1, "key-reserved": 1, "socket-not-allowed": 1, "socket-dotdot": 1}

    # a repair gives net1 a new MAC: the running container reads it
    netns = ctd.cri.pod_status(good).netns_path
    old_mac = seen[1]["mac"]
    subprocess.run(["nsenter", f"--net={netns}", "ip", "link", "del", "net1"], check=True)
    status, payload = localproto.call(
        daemon.socket,
        {localproto.OP_KEY: "verify"},
        json.dumps({"pod": good, "check": False}).encode(),
        timeout=120,
    )
    assert status == 0, payload
    after = _read_status(ctd, cid)
    assert after[1]["mac"] != old_mac
    report = _report(daemon, good)
    report[1]["metadata"] = {"example.com/vf": "3"}
    assert after == report

    # nri-cni restarted: a new container gets the same adjustment
    daemon.stop()
    daemon = _start_daemon(n, cfg)
    cid2 = _container(ctd, good, good_sandbox, busybox.ref)
    assert _read_status(ctd, cid2) == after
    assert _spec(ctd, cid2)["annotations"]["k8s.v1.cni.cncf.io/network-status"] == annotations[
        "k8s.v1.cni.cncf.io/network-status"
    ].replace(old_mac, after[1]["mac"])

    for pod in (good, bad):
        ctd.cri.stop_pod(pod)
        ctd.cri.remove_pod(pod)
    assert ctd.cri.list_containers() == []
    assert os.listdir(n.setup.state_dir / "containers") == []
    assert leaks.leaks() == []
