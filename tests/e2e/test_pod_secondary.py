"""Secondary mode through real containerd 2.1.9: containerd's own CNI (a bridge list in its conf
dir) makes eth0; nri-cni adds net1 (macvlan over a veth master the test made) in NRI
RunPodSandbox and runs FINALIZE for both, the runtime's primary included (its result read from
containerd's libcni cache, /var/lib/cni/results/<primary>-<pod>-eth0).

Failure paths: net1's ADD fails, or a FINALIZE plugin of net1 fails. nri-cni rolls its network
back either way; containerd 2.1.9 leaks the sandbox when NRI fails the pod (containerd#13355),
so the default failure_policy "auto" keeps the pod, logs, and lets the repair loop retry, while
failure_policy "fail" fails the pod (unique pod names: the leaked sandbox keeps its name).

Subnets: 10.246.128.0/18, one pair per test (containerd's bridge gets a host route).
"""

from __future__ import annotations

import ipaddress
import subprocess
import time

import pytest

from tests.support.bin_dir import install_plugin, python_script
from tests.support.cutcalls import cri_refused
from tests.support.hostlocal import host_local_reservations
from tests.support.hostnet import bridge_ports, cni_cache_files, netns_ipv4_addrs
from tests.support.names import unique_name
from tests.support.secondarynode import SecondaryNode

pytestmark = pytest.mark.e2e


def _links(netns: str) -> list[str]:
    out = subprocess.run(
        ["nsenter", f"--net={netns}", "ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    )
    return sorted(line.split(": ")[1].split("@")[0] for line in out.stdout.splitlines())


def _in(cidr_or_ip: str, subnet: str) -> bool:
    return ipaddress.ip_interface(cidr_or_ip).ip in ipaddress.ip_network(subnet)


def _listed(daemon) -> list[tuple[str, str, list[str]]]:
    """`nri-cni pods`: (pod id, state, interfaces) of every pod."""
    return [(p["id"], p["state"], [n["interface"] for n in p["network-status"]]) for p in daemon.pods()]


def _assert_pod_gone_clean(node: SecondaryNode, pods: list[str]) -> None:
    for pod in pods:
        assert cni_cache_files(pod) == [], "containerd's cache entry of the pod remains"
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert host_local_reservations(node.primary.ipam_dir) == []
    assert bridge_ports(node.primary.bridge) == []
    assert node.daemon.pods() == []
    assert node.leaks.leaks() == []


def test_containerd_eth0_nri_cni_net1_finalize_both_and_clean_removal(make_secondary_node):
    node = make_secondary_node(("10.246.130.0/24", "10.246.131.0/24"))
    daemon = node.start()
    ctd = node.ctd
    pods = [node.run_pod("sec") for _ in range(2)]
    statuses = [ctd.cri.pod_status(p) for p in pods]
    for pod, st in zip(pods, statuses):
        node.leaks.add_markers(pod, st.ip)
        assert st.ready
        # CRI's pod IP is containerd's own network's, on eth0
        assert _in(st.ip, node.primary.subnet), st.ip
        assert f"{st.ip}/24" in netns_ipv4_addrs(st.netns_path, "eth0")
        # nri-cni's net1, from its own range
        net1 = netns_ipv4_addrs(st.netns_path, "net1")
        assert len(net1) == 1 and _in(net1[0], node.net1_subnet), net1
        assert _links(st.netns_path) == ["eth0", "lo", "net1"]
        # containerd's cache holds its own networks (eth0, and lo); nri-cni's holds net1 only
        assert sorted(p.name for p in cni_cache_files(pod)) == sorted(
            [f"{node.primary.name}-{pod}-eth0", f"cni-loopback-{pod}-lo"]
        )
        mine = sorted(p.name for p in (node.setup.cache_dir / "results").iterdir() if pod in p.name)
        assert mine == [f"fastnet-{pod}-net1"]
        # FINALIZE ran for the runtime's eth0 and then nri-cni's net1, both interfaces present
        assert node.probe_calls(pod) == [
            ("FINALIZE", "eth0", "eth0,lo,net1"),
            ("FINALIZE", "net1", "eth0,lo,net1"),
        ]
    node.leaks.learn()
    assert len(bridge_ports(node.primary.bridge)) == 2
    assert len(host_local_reservations(node.setup.ipam_dir)) == 2
    # containerd's eth0 works between the pods; net1 (macvlan, bridge mode) too
    ping = subprocess.run(
        ["nsenter", f"--net={statuses[0].netns_path}", "ping", "-c", "1", "-W", "2", statuses[1].ip],
        capture_output=True,
        text=True,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    peer_net1 = netns_ipv4_addrs(statuses[1].netns_path, "net1")[0].split("/")[0]
    ping = subprocess.run(
        ["nsenter", f"--net={statuses[0].netns_path}", "ping", "-c", "1", "-W", "2", "-I", "net1", peer_net1],
        capture_output=True,
        text=True,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # `nri-cni pods` lists containerd's eth0 (read from its libcni cache, the default) and net1
    table = {p["id"]: p for p in daemon.pods()}
    assert set(table) == set(pods)
    status = table[pods[0]]["network-status"]
    assert [(n["name"], n["interface"]) for n in status] == [(node.primary.name, "eth0"), ("fastnet", "net1")]
    assert status[0]["default"] is True and "default" not in status[1]
    # one op line per pod: the ADD of fastnet, FINALIZE of both networks
    adds = [op for op in daemon.op_lines() if op["op"] == "add" and op["podId"] == pods[0]]
    assert len(adds) == 1 and adds[0]["result"] == "ok", adds
    assert [(n["network"], n["op"]) for n in adds[0]["networks"]] == [
        ("fastnet", "add"),
        (node.primary.name, "finalize"),
        ("fastnet", "finalize"),
    ]

    node.remove_pod(pods[0])
    # the other pod is untouched
    assert _links(statuses[1].netns_path) == ["eth0", "lo", "net1"]
    assert len(host_local_reservations(node.setup.ipam_dir)) == 1
    node.remove_pod(pods[1])
    _assert_pod_gone_clean(node, pods)
    # NRI stop DELs net1 while the netns exists (before containerd's own DEL)
    dels = [op for op in daemon.op_lines() if op["op"] == "del" and op["podId"] in pods and op["networks"]]
    assert sorted(op["podId"] for op in dels) == sorted(pods), dels
    assert all(op["result"] == "ok" for op in dels), dels


def test_net1_add_failure_auto_policy_keeps_the_pod_and_repair_attaches_it_later(make_secondary_node):
    node = make_secondary_node(("10.246.132.0/24", "10.246.133.0/24"))
    missing = unique_name("mm")  # a master that does not exist yet
    daemon = node.start(node.fastnet(master=missing), gc={"interval": "1s"})
    ctd = node.ctd
    pod = node.run_pod("auto")  # containerd 2.1.9 would leak a failed sandbox: the pod is kept
    st = ctd.cri.pod_status(pod)
    node.leaks.add_markers(pod, st.ip)
    assert st.ready and _in(st.ip, node.primary.subnet)
    # nri-cni's network is absent, rolled back entirely; the error is in its log
    assert _links(st.netns_path) == ["eth0", "lo"]
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert _listed(daemon) == [(pod, "repair", ["eth0"])]  # containerd's eth0 only, net1 retried
    assert not (node.setup.state_dir / "intents" / pod).exists()  # no intent record left
    log = daemon.log_path.read_text()
    kept = [ln for ln in log.splitlines() if "the pod is kept and the attachment retried" in ln]
    assert kept and "network 'fastnet', plugin 'macvlan', ADD" in kept[0], log
    assert pod in daemon.status()["pendingRepair"]
    # the repair loop retries; once the master exists the pod gets net1 and FINALIZE for both
    node.jan.veth(host_name=missing)
    deadline = time.monotonic() + 120
    while pod in daemon.status()["pendingRepair"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert daemon.status()["pendingRepair"] == []
    assert _links(st.netns_path) == ["eth0", "lo", "net1"]
    assert _in(netns_ipv4_addrs(st.netns_path, "net1")[0], node.net1_subnet)
    assert node.probe_calls(pod)[-2:] == [
        ("FINALIZE", "eth0", "eth0,lo,net1"),
        ("FINALIZE", "net1", "eth0,lo,net1"),
    ]
    assert [n["interface"] for n in daemon.pods()[0]["network-status"]] == ["eth0", "net1"]
    node.leaks.learn()
    node.remove_pod(pod)
    _assert_pod_gone_clean(node, [pod])


def test_net1_add_failure_fail_policy_fails_the_pod_cleanly(make_secondary_node):
    node = make_secondary_node(("10.246.134.0/24", "10.246.135.0/24"))
    missing = unique_name("mm")
    node.start(node.fastnet(master=missing), failure_policy="fail")
    msg = str(cri_refused(node.run_pod, "fail"))
    assert "NRI RunPodSandbox failed" in msg, msg
    assert "network 'fastnet', plugin 'macvlan', ADD: Link not found" in msg, msg
    pod = node.failed_pod_id()
    node.leaks.add_markers(pod)
    # nri-cni rolled net1 back; containerd tore its own network down
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert not (node.setup.state_dir / "intents" / pod).exists()
    _assert_pod_gone_clean(node, [pod])


def test_net1_finalize_failure_fail_policy_rolls_net1_back(make_secondary_node):
    node = make_secondary_node(("10.246.136.0/24", "10.246.137.0/24"))
    refuse = {
        "type": "fake-fail",
        "fake": {
            "FINALIZE": {
                "error": {"code": 120, "msg": "nct finalize refuses", "details": "by design of the test"}
            }
        },
    }
    node.start(node.fastnet(finalize_plugins=[refuse]), failure_policy="fail")
    msg = str(cri_refused(node.run_pod, "fin"))
    assert "nct finalize refuses" in msg and "fastnet" in msg and "fake-fail" in msg, msg
    pod = node.failed_pod_id()
    node.leaks.add_markers(pod)
    # eth0's FINALIZE ran (drop-in), then net1's own finalize plugin failed before the drop-in
    assert node.probe_calls(pod) == [("FINALIZE", "eth0", "eth0,lo,net1")]
    rollback = [
        n
        for op in node.daemon.op_lines()
        if op["podId"] == pod
        for n in op["networks"]
        if n["op"] == "rollback"
    ]
    assert [n["network"] for n in rollback] == ["fastnet"]
    _assert_pod_gone_clean(node, [pod])


def test_net1_finalize_failure_auto_policy_keeps_the_pod_without_net1(make_secondary_node):
    node = make_secondary_node(("10.246.138.0/24", "10.246.139.0/24"))
    refuse = {"type": "fake-fail", "fake": {"FINALIZE": {"error": {"code": 121, "msg": "nct no"}}}}
    daemon = node.start(node.fastnet(finalize_plugins=[refuse]))
    pod = node.run_pod("finauto")
    st = node.ctd.cri.pod_status(pod)
    node.leaks.add_markers(pod, st.ip)
    assert st.ready
    assert _links(st.netns_path) == ["eth0", "lo"]  # net1 rolled back
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert _listed(daemon) == [(pod, "repair", ["eth0"])]
    assert pod in daemon.status()["pendingRepair"]
    assert "nct no" in daemon.log_path.read_text()
    node.leaks.learn()
    node.remove_pod(pod)
    _assert_pod_gone_clean(node, [pod])
    assert daemon.status()["pendingRepair"] == []  # a removed pod is not repaired


def test_pod_started_while_nri_cni_was_down_gets_net1_when_it_connects(make_secondary_node):
    node = make_secondary_node(("10.246.142.0/24", "10.246.143.0/24"))
    daemon = node.start()
    daemon.stop()  # containerd runs pods without NRI plugins meanwhile
    pod = node.run_pod("late")
    st = node.ctd.cri.pod_status(pod)
    node.leaks.add_markers(pod, st.ip)
    assert st.ready and _links(st.netns_path) == ["eth0", "lo"]
    daemon.start()  # Synchronize lists the pod; repair attaches net1 and runs FINALIZE for both
    daemon.wait_idle()
    assert _links(st.netns_path) == ["eth0", "lo", "net1"]
    assert node.probe_calls(pod) == [
        ("FINALIZE", "eth0", "eth0,lo,net1"),
        ("FINALIZE", "net1", "eth0,lo,net1"),
    ]
    node.leaks.learn()
    node.remove_pod(pod)
    _assert_pod_gone_clean(node, [pod])


def test_finalize_changing_the_primary_result_stays_out_of_nri_cni_cache(make_secondary_node):
    """A FINALIZE plugin that returns a changed result for containerd's eth0 must not turn
    containerd's attachment into one of nri-cni's (nri-cni's cache holds only its own)."""
    node = make_secondary_node(("10.246.140.0/24", "10.246.141.0/24"))
    # The drop-in adds a DNS entry to every result it is given (so also to the primary's).
    dns = (
        "import json, sys\n"
        'result = json.load(sys.stdin)["prevResult"]\n'
        'result["dns"] = {"nameservers": ["10.246.140.53"]}\n'
        "print(json.dumps(result))\n"
    )
    install_plugin(node.setup.bin_dir, "nct-dns", python_script(dns))
    (node.setup.finalize_dir / "60-dns.conf").write_text('{"type": "nct-dns"}')
    daemon = node.start()
    pod = node.run_pod("dns")
    st = node.ctd.cri.pod_status(pod)
    node.leaks.add_markers(pod, st.ip)
    assert _links(st.netns_path) == ["eth0", "lo", "net1"]
    mine = sorted(p.name for p in (node.setup.cache_dir / "results").iterdir() if pod in p.name)
    assert mine == [f"fastnet-{pod}-net1"]
    assert [n["interface"] for n in daemon.pods()[0]["network-status"]] == ["eth0", "net1"]
    node.leaks.learn()
    node.remove_pod(pod)
    _assert_pod_gone_clean(node, [pod])
    # nri-cni DELs its own network only; containerd's DEL is containerd's
    deleted = {
        (n["network"], n["ifname"]) for op in daemon.op_lines() if op["op"] == "del" for n in op["networks"]
    }
    assert deleted == {("fastnet", "net1")}
