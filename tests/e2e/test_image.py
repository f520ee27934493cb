"""The DaemonSet's image, built from Containerfile (config/image/build.sh) and run with podman the
way the kubelet runs config/kubernetes/nri-cni.yaml on a node: its init container, then the
daemon, with exactly the flags the manifest gives (tests/support/daemonset.py derives them; the
test adds only each container's name and --detach). Only the node's host paths are moved, onto a private containerd
with NRI on: the daemon in the container registers with it, the runtime's pod gets its IP
through the shim the init container installed, `nri-cni status` (the probes' own commands)
answers, and the daemon stops cleanly on the kubelet's SIGTERM.

The image and its base stay in config/image/podman.sh's store (/var/tmp/nri-cni-image unless
NRI_CNI_IMAGE_STORE says otherwise) as a build cache; the containers, links, namespaces and
files of a run are removed."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import daemonset
from tests.support.containerd import NRI, Containerd
from tests.support.hostlocal import host_local_reservations
from tests.support.hostnet import netns_addrs
from tests.support.leaks import LeakChecker
from tests.support.names import free_subnet
from tests.support.netns import delete_link, link_exists

# the first test builds the image when the store has none yet (a minute or two; .ci/run builds first)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "config" / "kubernetes").glob("*.yaml"))
BUILD = REPO / "config" / "image" / "build.sh"
PODMAN = REPO / "config" / "image" / "podman.sh"
NODE_NAME = "nciimg-node"
POD_NS = "nciimg-e2e"
READY_DEADLINE = 120.0  # a busy machine; the daemon needs about a second


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", str(PODMAN), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this checkout (podman's layer cache makes a rebuild of an unchanged tree quick)."""
    for tool in ("podman", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} missing: run .ci/install-deps"
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tag = proc.stdout.strip().splitlines()[-1]
    # by its ID: another checkout's build may give the tag to its own tree meanwhile
    return podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def _manifest_docs() -> list[dict[str, Any]]:
    return daemonset.load(MANIFESTS)


def _node_config_map(cm: dict[str, Any], *, bridge: str, subnet: str, host_socket: Path) -> dict[str, Any]:
    """The manifest's ConfigMap as an admin would edit it for this node: its network's bridge
    named for this test, no masquerade and no default route (nothing leaves the machine), this
    node's subnet in nodes.yaml, the shim list pointed at the daemon socket's host path."""
    data = dict(cm["data"])
    cfg = yaml.safe_load(data["config.yaml"])
    for net in cfg["networks"]:
        for plugin in net["conflist"]["plugins"]:
            if plugin["type"] == "bridge":
                plugin["bridge"] = bridge
                plugin["ipMasq"] = False
                plugin["ipam"].pop("routes", None)
    data["config.yaml"] = yaml.safe_dump(cfg)
    data["nodes.yaml"] = yaml.safe_dump({"*": {}, NODE_NAME: {"podSubnet": subnet}})
    shim_list = json.loads(data["10-nri-cni.conflist"])
    for plugin in shim_list["plugins"]:
        if plugin["type"] == "nri-cni-shim":
            plugin["daemonSocket"] = str(host_socket)
    data["10-nri-cni.conflist"] = json.dumps(shim_list, indent=2)
    return {**cm, "data": data}


class Node:
    """A node's host paths under one private directory, and the containers run on it."""

    def __init__(self, root: Path, image: str) -> None:
        self.root = root
        self.image = image
        self.tag = secrets.token_hex(3)
        self.containers: list[str] = []
        self.created: list[Path] = []  # host paths made as the kubelet would (...OrCreate)

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def run(self, run: daemonset.ContainerRun, *, detach: bool) -> subprocess.CompletedProcess[str]:
        for m in run.mounts:
            # what the kubelet does for a hostPath of type DirectoryOrCreate / FileOrCreate
            target = Path(m.host)
            if target.exists() or m.host_type not in ("DirectoryOrCreate", "FileOrCreate"):
                continue
            if m.host_type == "DirectoryOrCreate":
                target.mkdir(parents=True)
            else:
                target.touch()
            if not target.is_relative_to(self.root):  # the machine's own: removed afterwards
                self.created.append(target)
        name = f"nciimg-{self.tag}-{run.name}"
        self.containers.append(name)
        mode = ["--detach"] if detach else []
        return podman("run", f"--name={name}", *mode, *run.podman_flags(), self.image, *run.args)

    def exec(self, name: str, argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return podman("exec", f"nciimg-{self.tag}-{name}", *argv, check=False, timeout=60)

    def logs(self, name: str) -> str:
        proc = podman("logs", f"nciimg-{self.tag}-{name}", check=False)
        return proc.stdout + proc.stderr

    def cleanup(self) -> list[str]:
        problems = []
        for name in reversed(self.containers):
            proc = podman("rm", "--force", "--time=0", "--ignore", name, check=False)
            if proc.returncode != 0:
                problems.append(f"podman rm {name}: {proc.stderr.strip()}")
        left = podman("ps", "--all", "--filter", f"name=nciimg-{self.tag}", "--format", "{{.Names}}").stdout
        if left.strip():
            problems.append(f"containers left: {left.split()}")
        for path in reversed(self.created):
            if path.is_dir():
                path.rmdir()  # what the containers left in it is a problem (OSError)
            else:
                path.unlink(missing_ok=True)
        return problems


@pytest.fixture
def node(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    # a short root: unix socket paths under it must fit in 107 bytes
    root = Path(tmp_path_factory.mktemp("img"))
    n = Node(root, image)
    # podman's CNI backend makes its config dir when it has none; the store's is its own
    system_cni = Path("/etc/cni/net.d").exists()
    yield n
    problems = n.cleanup()
    if Path("/etc/cni/net.d").exists() != system_cni:
        problems.append("/etc/cni/net.d appeared")
    if problems:
        pytest.fail("container cleanup: " + "; ".join(problems))


@pytest.fixture
def bridge() -> Iterator[str]:
    """The name of the pods' bridge; requested before containerd, so removed after its pods."""
    name = f"nciimg{secrets.token_hex(3)}"
    yield name
    delete_link(name)


def _wait_probe(
    node: Node, run: daemonset.ContainerRun, argv: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + READY_DEADLINE
    while True:
        proc = node.exec(run.name, argv)
        if proc.returncode == 0:
            return proc
        state = podman("inspect", "--format", "{{.State.Status}}", f"nciimg-{node.tag}-{run.name}").stdout
        if state.strip() != "running" or time.monotonic() > deadline:
            raise AssertionError(
                f"probe {argv} never passed (container {state.strip()}):\n{node.logs(run.name)}"
            )
        time.sleep(0.5)


def test_the_manifest_gives_every_field_a_flag_or_a_reason():
    """The translation refuses a field it does not know (so the manifest and this test cannot
    drift apart) and gives the daemon what the manifest says."""
    docs = _manifest_docs()
    ds = daemonset.only(docs, "DaemonSet")
    inits, (main,) = daemonset.container_runs(
        ds, config_maps={"nri-cni-config": "/cm"}, field_values={"spec.nodeName": "n1"}
    )
    flags = main.podman_flags()
    assert "--network=host" in flags and "--privileged" in flags and "--pid=host" not in flags
    assert "--env=NODE_NAME=n1" in flags
    assert "--volume=/var/run/netns:/var/run/netns:rw,rslave" in flags
    assert "--volume=/cm:/etc/nri-cni:ro,rprivate" in flags
    assert f"--stop-timeout={ds['spec']['template']['spec']['terminationGracePeriodSeconds']}" in flags
    assert [i.name for i in inits] == ["install-shim"]
    spec = ds["spec"]["template"]["spec"]
    for key, value in (("hostIPC", True), ("dnsPolicy", "None")):
        bad = {**ds, "spec": {**ds["spec"], "template": {"spec": {**spec, key: value}}}}
        with pytest.raises(daemonset.ManifestError, match=key):
            daemonset.container_runs(
                bad, config_maps={"nri-cni-config": "/cm"}, field_values={"spec.nodeName": "n"}
            )


def test_the_image_runs_as_the_daemonset_says(bridge: str, node: Node, make_containerd) -> None:
    docs = _manifest_docs()
    ds = daemonset.only(docs, "DaemonSet")
    (cm,) = [d for d in docs if d.get("kind") == "ConfigMap"]
    subnet = str(free_subnet())
    # a bare node: its CNI bin dir is empty, the init container installs the image's plugins
    # (bookworm's, CNI <= 1.0.0) and the shim, and the ConfigMap's network as shipped runs on them
    bin_dir = node.host("/opt/cni/bin")
    bin_dir.mkdir(parents=True)
    daemon_socket_dir = node.host("/run/nri-cni")
    cm_dir = daemonset.write_config_map(
        _node_config_map(cm, bridge=bridge, subnet=subnet, host_socket=daemon_socket_dir / "nri-cni.sock"),
        node.root / "configmap" / cm["metadata"]["name"],
    )
    moved = [
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/var/run/nri",
        "/run/nri-cni",
        "/var/lib/cni",
        "/var/lib/nri-cni",
    ]
    if not Path("/lib/modules").is_dir():
        # a kernel without modules (a VM's): containerd would create the missing host path
        # of a hostPath without a type; a private empty directory is the same to the daemon
        moved.append("/lib/modules")
        node.host("/lib/modules").mkdir(parents=True)
    inits, (main,) = daemonset.container_runs(
        ds,
        host_paths={p: node.host(p) for p in moved},
        config_maps={cm["metadata"]["name"]: cm_dir},
        field_values={"spec.nodeName": NODE_NAME},
    )
    leaks = LeakChecker(
        dirs=[node.host("/var/lib/cni"), node.host("/var/lib/nri-cni")], bridges=[bridge]
    ).start()

    # 1. the init container installs the image's static shim and the shim list on the node
    for init in inits:
        out = node.run(init, detach=False)
        assert "installed the static nri-cni-shim" in out.stdout, out.stdout + out.stderr
    assert os.access(bin_dir / "nri-cni-shim", os.X_OK)
    # ... and the image's plugins, which the ConfigMap's network runs on
    assert all(os.access(bin_dir / p, os.X_OK) for p in ("bridge", "host-local", "portmap", "loopback"))
    conf_dir = node.host("/etc/cni/net.d")
    assert json.loads((conf_dir / "10-nri-cni.conflist").read_text())["plugins"][0]["type"] == "nri-cni-shim"

    # 2. the runtime: containerd with NRI's socket where the manifest's /var/run/nri points
    nri_socket = node.host("/var/run/nri") / "nri.sock"
    ctd: Containerd = make_containerd(
        cni_conf_dir=conf_dir,
        cni_bin_dirs=[bin_dir],
        extra={"plugins": {NRI: {"socket_path": str(nri_socket)}}},
    )

    # 3. the daemon, until its readiness probe passes; `nri-cni status` says it is registered
    node.run(main, detach=True)
    assert main.readiness is not None and main.liveness is not None
    _wait_probe(node, main, main.readiness)
    status = node.exec(main.name, ("nri-cni", "status", "-o", "json"))
    assert status.returncode == 0, status.stdout + status.stderr + node.logs(main.name)
    report = json.loads(status.stdout)
    assert report["nri"]["synchronized"] is True, report

    # 4. a pod through CRI: containerd runs the shim, the daemon in the container attaches it
    pod = ctd.cri.run_pod(f"web-{node.tag}", POD_NS, str(uuid.uuid4()))
    st = ctd.cri.pod_status(pod)
    leaks.add_markers(pod, st.ip)
    assert st.ready
    assert ipaddress.ip_address(st.ip) in ipaddress.ip_network(subnet)
    assert st.netns_path and any(a.startswith(f"{st.ip}/") for a in netns_addrs(st.netns_path))
    assert link_exists(bridge)
    leaks.learn()
    pods = node.exec(main.name, ("nri-cni", "pods", "-o", "json"))
    assert pods.returncode == 0, pods.stderr
    assert [p["id"] for p in json.loads(pods.stdout)] == [pod]
    assert node.exec(main.name, main.liveness).returncode == 0

    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)
    assert host_local_reservations(node.host("/var/lib/cni/networks") / "pods") == []

    # 5. the kubelet's stop: SIGTERM, the grace period; the daemon exits 0 before it ends
    podman("stop", f"nciimg-{node.tag}-{main.name}", timeout=(main.stop_timeout or 30) + 60)
    state = json.loads(podman("inspect", f"nciimg-{node.tag}-{main.name}").stdout)[0]["State"]
    log = node.logs(main.name)
    assert state["ExitCode"] == 0 and "Traceback" not in log, log
    assert not (daemon_socket_dir / "nri-cni.sock").exists()
    assert leaks.leaks() == []
