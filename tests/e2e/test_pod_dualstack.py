"""Dual-stack and IPv6-only pods in shim mode through real containerd: CRI reports every
address nri-cni's network gave (PodSandboxStatus ip + additional_ips), the pods reach each other
over both families, `nri-cni pods` lists both; a flushed IPv6 address is repaired with both of
the pod's addresses (verify on demand), the intact pod left alone; stop and remove leave nothing."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid

import pytest

from nri_cni.local import proto as localproto
from tests.support.hostlocal import host_local_reservations
from tests.support.hostnet import netns_reaches

pytestmark = pytest.mark.e2e

V4 = "10.246.44.0/24"
V6 = "fd00:246:44::/64"


def _global_addrs(netns_path: str, ifname: str = "eth0") -> list[str]:
    out = subprocess.run(
        ["nsenter", f"--net={netns_path}", "ip", "-o", "addr", "show", "dev", ifname, "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line.split()[3].split("/")[0] for line in out.stdout.splitlines())


def _verify(daemon, pod_id: str) -> dict:
    body = json.dumps({"pod": pod_id, "check": False}).encode()
    status, payload = localproto.call(daemon.socket, {localproto.OP_KEY: "verify"}, body, timeout=120)
    data = json.loads(payload)
    assert status == 0, data
    (verdict,) = data
    return verdict


@pytest.mark.parametrize("subnets", [[V4, V6], [V6]], ids=["dual-stack", "ipv6-only"])
def test_every_family_is_answered_reachable_repaired_and_released(shim_node, subnets):
    node = shim_node
    nets = node.networks()
    nets[0]["conflist"]["plugins"][0]["ipam"]["ranges"] = [[{"subnet": s}] for s in subnets]
    node.start(nets[:1])
    ctd, daemon = node.ctd, node.daemon
    pods = [ctd.cri.run_pod(f"ds-{i}", "nct-e2e", str(uuid.uuid4())) for i in range(2)]
    st = [ctd.cri.pod_status(p) for p in pods]
    ips = []
    for s in st:
        node.leaks.add_markers(s.id, s.ip)
        mine = sorted([s.ip, *s.additional_ips])
        ips.append(mine)
        # one address from each range, all of them on eth0 as CRI reports them
        for net in subnets:
            assert len([ip for ip in mine if ipaddress.ip_address(ip) in ipaddress.ip_network(net)]) == 1, (
                mine
            )
        assert len(mine) == len(subnets), mine
        assert _global_addrs(s.netns_path) == mine
    node.leaks.learn()
    for a, b in ((0, 1), (1, 0)):
        for ip in ips[b]:
            assert netns_reaches(st[a].netns_path, ip), f"pod {a} cannot reach {ip}"
    table = {p["id"]: p for p in daemon.pods()}
    assert sorted(table[pods[0]]["network-status"][0]["ips"]) == ips[0]

    # damage: pod 0 loses its IPv6 address; verify repairs it with every address it had
    v6 = [ip for ip in ips[0] if ":" in ip]
    subprocess.run(
        [
            "nsenter",
            f"--net={st[0].netns_path}",
            "ip",
            "-6",
            "addr",
            "flush",
            "dev",
            "eth0",
            "scope",
            "global",
        ],
        check=True,
    )
    ifindex_1 = _ifindex(st[1].netns_path)
    verdict = _verify(daemon, pods[0])
    assert verdict["state"] == "repaired", verdict
    assert _global_addrs(st[0].netns_path) == ips[0]
    assert _verify(daemon, pods[1])["state"] == "ok" and _ifindex(st[1].netns_path) == ifindex_1
    assert netns_reaches(st[1].netns_path, v6[0])
    (repair,) = [r for r in daemon.op_lines() if r["op"] == "repair"]
    assert sorted(repair["asked"]["podnet/eth0"]) == ips[0]

    for pod in pods:  # the DELs after the repair carry no request: both succeed
        ctd.cri.stop_pod(pod)
        ctd.cri.remove_pod(pod)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    assert node.leaks.leaks() == []


def _ifindex(netns_path: str) -> int:
    out = subprocess.run(
        ["nsenter", f"--net={netns_path}", "cat", "/sys/class/net/eth0/ifindex"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)
