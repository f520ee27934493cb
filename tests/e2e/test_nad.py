"""NetworkAttachmentDefinition files through real containerd 2.1.9: a NAD in
`nad_dir` is a network pods of its namespace ask for with the Multus annotation; a NAD file
added while nri-cni runs is picked up by hot reload; `nri-cni pods` names it namespace/name."""

from __future__ import annotations

import ipaddress
import time

import pytest

from tests.support.conflists import nad
from tests.support.hostnet import netns_ipv4_addrs
from tests.support.shimnode import run_pod

pytestmark = pytest.mark.e2e


def wait_for_network(daemon, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name in daemon.status()["networks"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"network {name} was not loaded: {daemon.log_tail()}")


def test_a_nad_file_attaches_a_pod_through_the_annotation(shim_node, tmp_path):
    node = shim_node
    nad_dir = tmp_path / "nad.d"
    nad_dir.mkdir()
    ipam = str(node.setup.ipam_dir)
    (nad_dir / "macvlan-conf.yaml").write_text(nad("macvlan-conf", node.master, "10.246.42.0/24", ipam))
    podnet = node.networks()[:1]  # nri-cni's bridge eth0 only: net1 comes from the NAD
    node.start(podnet, nad_dir=str(nad_dir), reload={"rescan_interval": 0, "debounce": "50ms"})
    ctd, daemon = node.ctd, node.daemon

    pod = run_pod(ctd, "nad-1", {"k8s.v1.cni.cncf.io/networks": "macvlan-conf"})
    st = ctd.cri.pod_status(pod)
    node.leaks.add_markers(pod, st.ip)
    assert st.ready
    net1 = netns_ipv4_addrs(st.netns_path, "net1")
    assert len(net1) == 1 and ipaddress.ip_interface(net1[0]) in ipaddress.ip_network("10.246.42.0/24")
    listed = {p["id"]: p for p in daemon.pods()}[pod]["network-status"]
    assert [(n["name"], n["interface"]) for n in listed] == [
        ("podnet", "eth0"),
        ("nct-e2e/macvlan-conf", "net1"),
    ]
    assert listed[1]["ips"] == [net1[0].split("/")[0]]

    # a second NAD written while nri-cni runs: hot reload makes it a network, by namespace/name too
    (nad_dir / "other.yaml").write_text(nad("other", node.master, "10.246.43.0/24", ipam))
    wait_for_network(daemon, "other-net")
    pod2 = run_pod(ctd, "nad-2", {"k8s.v1.cni.cncf.io/networks": "nct-e2e/other@extra0"})
    st2 = ctd.cri.pod_status(pod2)
    node.leaks.add_markers(pod2, st2.ip)
    extra = netns_ipv4_addrs(st2.netns_path, "extra0")
    assert len(extra) == 1 and ipaddress.ip_interface(extra[0]) in ipaddress.ip_network("10.246.43.0/24")
    node.leaks.learn()

    for p in (pod, pod2):
        ctd.cri.stop_pod(p)
        ctd.cri.remove_pod(p)
    assert daemon.pods() == []
    assert node.leaks.leaks() == []
