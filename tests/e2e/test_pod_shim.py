"""Shim mode through real containerd 2.1.9: nri-cni-shim is containerd's only CNI network; the
daemon attaches the pod's whole plan (bridge eth0, macvlan net1 over a veth master the test made,
FINALIZE), and containerd reports nri-cni's IP through CRI."""

from __future__ import annotations

import ipaddress
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.cutcalls import cri_refused
from tests.support.finalize_probe import probe_calls
from tests.support.hostlocal import host_local_reservations
from tests.support.hostnet import netns_ipv4_addrs
from tests.support.shimnode import run_pod

pytestmark = pytest.mark.e2e


def test_two_networks_finalize_cri_ip_reachability_and_clean_removal(shim_node):
    node = shim_node
    node.start()
    ctd, daemon = node.ctd, node.daemon
    ann = {"k8s.v1.cni.cncf.io/networks": "fastnet"}
    pods = [run_pod(ctd, f"web-{i}", ann) for i in range(2)]
    statuses = [ctd.cri.pod_status(p) for p in pods]
    for pod, st in zip(pods, statuses):
        node.leaks.add_markers(pod, st.ip)
        assert st.ready
        # CRI reports the address nri-cni's bridge network assigned
        assert ipaddress.ip_address(st.ip) in ipaddress.ip_network("10.246.40.0/24")
        assert f"{st.ip}/24" in netns_ipv4_addrs(st.netns_path, "eth0")
        net1 = netns_ipv4_addrs(st.netns_path, "net1")
        assert len(net1) == 1 and ipaddress.ip_interface(net1[0]) in ipaddress.ip_network("10.246.41.0/24")
    node.leaks.learn()
    # the two pods reach each other over nri-cni's bridge
    ping = subprocess.run(
        ["nsenter", f"--net={statuses[0].netns_path}", "ping", "-c", "1", "-W", "2", statuses[1].ip],
        capture_output=True,
        text=True,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # FINALIZE ran for both networks, after both ADDs: eth0 and net1 both existed each time
    for pod in pods:
        mine = probe_calls(node.probe_log, pod)
        assert [ifname for _, ifname, _ in mine] == ["eth0", "net1"], mine
        assert all(verb == "FINALIZE" and links == "eth0,lo,net1" for verb, _, links in mine), mine
    # `nri-cni pods` shows both pods with both networks
    table = {p["id"]: p for p in daemon.pods()}
    assert set(table) == set(pods)
    assert [n["interface"] for n in table[pods[0]]["network-status"]] == ["eth0", "net1"]
    assert table[pods[0]]["network-status"][0]["ips"] == [statuses[0].ip]

    for pod in pods:
        ctd.cri.stop_pod(pod)
        ctd.cri.remove_pod(pod)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    assert node.leaks.leaks() == []


def test_daemon_down_fails_the_pod_cleanly(shim_node):
    node = shim_node
    node.start()
    node.daemon.stop()
    refused = cri_refused(run_pod, node.ctd, f"down-{uuid.uuid4().hex[:6]}")
    assert "nri-cni daemon is not reachable" in str(refused)
    # containerd tears the failed sandbox down; nothing of nri-cni's exists
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert node.leaks.leaks() == []


def test_second_network_failure_in_shim_mode_is_clear_and_leaves_nothing(shim_node):
    node = shim_node
    nets = node.networks(net1_default=True)
    nets[1]["conflist"]["plugins"][0]["master"] = "nctnomaster9"
    node.start(nets)
    msg = str(cri_refused(run_pod, node.ctd, f"bad-{uuid.uuid4().hex[:6]}"))
    assert "fastnet" in msg and "macvlan" in msg, msg
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert node.leaks.leaks() == []


def test_annotation_outside_the_allow_list_refuses_the_pod(shim_node):
    node = shim_node
    node.start()
    for value in ("kube-system/fastnet", "../../etc/cni/net.d/evil", "nosuchnet"):
        refused = cri_refused(
            run_pod, node.ctd, f"ann-{uuid.uuid4().hex[:6]}", {"k8s.v1.cni.cncf.io/networks": value}
        )
        assert "k8s.v1.cni.cncf.io/networks" in str(refused)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert node.leaks.leaks() == []


def test_fifty_pods_eight_at_a_time(shim_node):
    node = shim_node
    node.start(node.networks(net1_default=True, eth0_subnet="10.246.42.0/24", net1_subnet="10.246.43.0/24"))
    ctd, daemon = node.ctd, node.daemon
    names = [f"churn-{i}-{uuid.uuid4().hex[:4]}" for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        pods = list(pool.map(lambda n: run_pod(ctd, n), names))
    assert len(host_local_reservations(node.setup.ipam_dir)) == 100
    assert len(daemon.pods()) == 50

    def teardown(pod):
        ctd.cri.stop_pod(pod)
        ctd.cri.remove_pod(pod)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(teardown, pods))
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    # From the timing log: no two operations of one pod overlapped.
    spans: dict[str, list[tuple[float, float]]] = {}
    for line in daemon.op_lines():
        spans.setdefault(line["podId"], []).append((line["start"], line["end"]))
    assert set(pods) <= set(spans)
    for pod, ops in spans.items():
        ops.sort()
        for (s1, e1), (s2, e2) in zip(ops, ops[1:]):
            assert e1 <= s2, f"pod {pod}: operations overlap {ops}"
    assert node.leaks.leaks() == []
