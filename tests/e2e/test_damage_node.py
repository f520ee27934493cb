"""Ten kinds of damage at once on one node of real containerd with >= 20 dual-stack pods
(shim mode; the bridge plugin, host-local with an IPv4 and an IPv6 range and a route of each
family, portmap; pod 0 has a hostPort). One pod for each kind, all damaged at once: a route of
the result deleted in its netns, eth0 set down, its DNAT rules (both families) flushed, its host-local lease
file deleted, eth0 given a wrong address, its IPv6 address flushed, its netns path unmounted
(the pause process keeps the namespace), its host veth deleted, its eth0 deleted, its
addresses flushed. Every damaged pod is whole again with the same IPs (both families, as
netlink, host-local, the pod's routes, portmap's rules and containerd's CRI see them), except
the one whose netns path is gone: reported by name, `netns-unreadable`, never detached (its
leases held). The intact pods are untouched (no repair record, the same eth0). Then the bridge
is deleted: every pod is repaired again. The pods reach each other over both families, and
after they are removed nothing is left.
"""

from __future__ import annotations

import collections
import ipaddress
import random
import socket
import subprocess
import time
import uuid

import pytest

from tests.support.damage import damage, damage_left, dnat_ports, flush_dnat, unmount_netns_path
from tests.support.faultnode import broken_by_name
from tests.support.hostnet import netns_reaches
from tests.support.netns import get_link, list_routes
from tests.support.podtruth import RuntimePod, pod_interfaces, whole_problems
from tests.support.recovery_node import RecoveryNode, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

VERIFY = {"interval": "1s", "check_every": 1}
# a deadline for a hang only: the repairs come in the next verify rounds (1 s each)
DEADLINE = 120.0
PODS = 22
NETNS_GONE = "netns-path-unmounted"


def _ns(pod: RuntimePod, *argv: str) -> None:
    subprocess.run(["nsenter", f"--net={pod.netns}", *argv], check=True, capture_output=True, timeout=20)


class DamageNode:
    """The node's pods and what each held before the damage."""

    def __init__(self, rnode: RecoveryNode) -> None:
        self.rnode = rnode
        self.names: dict[str, str] = {}  # pod id -> its name
        block = random.randrange(0x100, 0xFFFF)
        self.v6 = f"fd00:246:{block:x}::/64"
        self.routed4 = rnode.net1_subnet  # a route the IPAM hands out, through the test's bridge
        self.routed6 = f"fd00:246:{block:x}:1::/64"

    def podnet(self) -> dict:
        net = self.rnode.podnet(finalize=False)
        ipam = net["conflist"]["plugins"][0]["ipam"]
        ipam["ranges"] = [[{"subnet": self.rnode.eth0_subnet}], [{"subnet": self.v6}]]
        ipam["routes"] = [{"dst": self.routed4}, {"dst": self.routed6}]
        return net

    def pods(self, count: int) -> list[RuntimePod]:
        tag = uuid.uuid4().hex[:6]
        ids = [self.rnode.run_pod(f"ncdmg-{tag}-{i}", ports=i == 0) for i in range(count)]
        self.names.update((pod_id, f"ncdmg-{tag}-{i}") for i, pod_id in enumerate(ids))
        listed = {p.id: p for p in self.rnode.runtime_pods()}
        return [listed[i] for i in ids]

    def snapshot(self, pods: list[RuntimePod]) -> dict[str, dict]:
        out = {}
        for pod in pods:
            eth0 = get_link("eth0", pod.netns)
            assert eth0 is not None and eth0.up
            out[pod.id] = {
                "addrs": pod_interfaces(pod.netns),
                "ifindex": eth0.index,
                "leases": sorted(r.ip for r in self.rnode.reserved_for(pod.id)),
                "dnat": {family: dnat_ports(pod.id, family) for family in (4, 6)},
            }
        return out

    def left(self, pod: RuntimePod, before: dict) -> list[str]:
        """What still differs from `before` (empty: the pod is whole, with the same IPs)."""
        problems = damage_left(pod, before["addrs"], ["eth0"], self.rnode.bridge)
        if problems:
            return problems
        name = f"pod {pod.id[:12]}"
        st = self.rnode.ctd.cri.pod_status(pod.id)
        if sorted(st.ips) != sorted(pod.ips):
            problems.append(f"{name}: containerd reports {st.ips}, before {pod.ips}")
        problems += whole_problems(pod, ["eth0"])
        eth0 = get_link("eth0", pod.netns)
        if eth0 is None or not eth0.up:
            problems.append(f"{name}: eth0 is not up")
        for family, dst in ((socket.AF_INET, self.routed4), (socket.AF_INET6, self.routed6)):
            if dst not in {r["dst"] for r in list_routes(pod.netns, family=family)}:
                problems.append(f"{name}: no route to {dst}")
        leases = sorted(r.ip for r in self.rnode.reserved_for(pod.id))
        if leases != before["leases"]:
            problems.append(f"{name}: leases {leases}, before {before['leases']}")
        for family, ports in before["dnat"].items():
            if ports and dnat_ports(pod.id, family) != ports:
                problems.append(f"{name}: IPv{family} DNAT {dnat_ports(pod.id, family)}, before {ports}")
        return problems


def _wrong_address(pod: RuntimePod, subnet: str) -> None:
    """eth0's IPv4 address replaced by another of the subnet (one no pod of 22 is given)."""
    [mine] = [a for a in pod_interfaces(pod.netns)["eth0"] if "." in a]
    wrong = f"{ipaddress.ip_network(subnet)[250]}/{ipaddress.ip_interface(mine).network.prefixlen}"
    _ns(pod, "ip", "addr", "del", mine, "dev", "eth0")
    _ns(pod, "ip", "addr", "add", wrong, "dev", "eth0")


def _kinds(node: DamageNode):
    """kind -> what does it to a pod (pod 0, the one with the hostPort, gets the DNAT flush)."""
    rnode = node.rnode
    return {
        "dnat-flushed": lambda pod: [flush_dnat(pod.id, family) for family in (4, 6)],
        "route-deleted": lambda pod: _ns(pod, "ip", "route", "del", node.routed4),
        "link-down": lambda pod: _ns(pod, "ip", "link", "set", "eth0", "down"),
        "lease-deleted": lambda pod: (rnode.setup.ipam_dir / "podnet" / pod.ips[0]).unlink(),
        "wrong-address": lambda pod: _wrong_address(pod, rnode.eth0_subnet),
        "ipv6-flushed": lambda pod: _ns(pod, "ip", "-6", "addr", "flush", "dev", "eth0", "scope", "global"),
        NETNS_GONE: lambda pod: unmount_netns_path(pod.netns),
        "host-veth-deleted": lambda pod: damage("host-veth-deleted", pod, "eth0", rnode.bridge),
        "pod-link-deleted": lambda pod: damage("pod-link-deleted", pod, "eth0", rnode.bridge),
        "address-flushed": lambda pod: damage("address-flushed", pod, "eth0", rnode.bridge),
    }


def _wait_whole(node: DamageNode, damaged_at: dict[str, float], pods, before, lost=None) -> None:
    """Polls (read-only) until every pod in `pods` is whole and `lost` is reported
    netns-unreadable (DEADLINE: a hang); prints, for each, how long after its damage (wall
    clock, `damaged_at`) nri-cni's repair record ends and the poll saw the pod whole (a poll
    reads each pod for about 0.2 s)."""
    pending = {p.id: p for p in pods}
    reported = lost is None
    start = min(damaged_at.values())
    while True:
        problems = []
        for pod_id, pod in list(pending.items()):
            left = node.left(pod, before[pod_id])
            if left:
                problems += left
                continue
            seen = time.time() - damaged_at[pod_id]
            ends = [
                op["end"]
                for op in node.rnode.daemon.op_lines()
                if op["op"] == "repair" and op["podId"] == pod_id and op["start"] >= damaged_at[pod_id]
            ]
            repaired = f"repaired {ends[0] - damaged_at[pod_id]:.2f} s" if ends else "no repair record"
            print(f"  {before[pod_id]['kind']}: pod {pod_id[:12]} {repaired}, seen whole {seen:.2f} s after")
            del pending[pod_id]
        if not reported and broken_by_name(node.rnode.daemon).get(lost.id) == "netns-unreadable":
            took = time.time() - damaged_at[lost.id]
            print(f"  {NETNS_GONE}: pod {lost.id[:12]} seen reported netns-unreadable {took:.2f} s after")
            reported = True
        if not pending and reported:
            return
        if time.time() - start > DEADLINE:
            broken = broken_by_name(node.rnode.daemon)
            raise AssertionError(f"{problems}\nbroken: {broken}\n{node.rnode.daemon.log_tail(80)}")
        time.sleep(0.05)


def _reach_ring(pods: list[RuntimePod]) -> None:
    """Each pod pings the next over both families (pods of the test's bridge only)."""
    silent = [
        f"{a.id[:12]} -> {ip}"
        for a, b in zip(pods, pods[1:] + pods[:1], strict=True)
        for ip in b.ips
        if not netns_reaches(a.netns, ip)
    ]
    assert silent == [], f"no answer: {silent}"


def test_every_damage_on_a_node_of_dual_stack_pods(rnode):
    node = DamageNode(rnode)
    rnode.start_containerd()
    daemon = rnode.start_daemon(rnode.daemon_config([node.podnet()], verify=VERIFY))
    # the leak baseline with a hostPort pod on the node: portmap's shared chains stay
    warm = rnode.run_pod(f"ncdmg-warm-{uuid.uuid4().hex[:6]}", ports=True)
    checker = rnode.leak_checker().start()
    pods = node.pods(PODS)
    checker.add_markers(*(p.id for p in pods), *(ip for p in pods for ip in p.ips))
    checker.learn()
    for pod in pods:  # dual-stack, as containerd reports it
        assert sorted(ipaddress.ip_address(ip).version for ip in pod.ips) == [4, 6], pod
    before = node.snapshot(pods)
    assert all(before[pods[0].id]["dnat"].values()), "pod 0 has a hostPort, both families DNAT"
    assert all(len(b["leases"]) == 2 for b in before.values())

    kinds = _kinds(node)
    damaged = dict(zip(kinds, pods, strict=False))  # kind -> pod: pod 0 first (dnat-flushed)
    intact = pods[len(kinds) :]
    assert len(intact) >= 10
    for kind, pod in damaged.items():
        before[pod.id]["kind"] = kind
    for pod in intact:
        before[pod.id]["kind"] = "intact"
    lost = damaged.pop(NETNS_GONE)
    damaged_at = {}
    for kind, pod in [*damaged.items(), (NETNS_GONE, lost)]:
        damaged_at[pod.id] = time.time()  # as the damage begins: a repair may end before it returns
        kinds[kind](pod)
    print(f"\n{len(kinds)} kinds of damage on {PODS} pods:")
    _wait_whole(node, damaged_at, list(damaged.values()), before, lost)
    left = [problem for pod in intact for problem in node.left(pod, before[pod.id])]
    assert left == [], left

    # reported, never detached: its leases held, no DEL
    (broken,) = daemon.status()["broken"]
    assert (broken["pod"], broken["code"]) == (lost.id, "netns-unreadable")
    assert broken["name"] == node.names[lost.id], broken
    assert lost.netns in broken["reason"]
    assert sorted(r.ip for r in rnode.reserved_for(lost.id)) == before[lost.id]["leases"]
    assert [op["op"] for op in daemon.op_lines() if op["podId"] == lost.id] == ["add"]
    rows = {row["id"]: row for row in daemon.pods()}
    assert rows[lost.id]["listed"] and [n["interface"] for n in rows[lost.id]["network-status"]] == ["eth0"]
    assert [p.id[:12] for p in intact if rows[p.id]["verify"]["state"] != "ok"] == []
    # repaired: each damaged pod has a record; the intact ones are untouched
    repaired = {op["podId"] for op in daemon.op_lines() if op["op"] == "repair"}
    assert {p.id for p in damaged.values()} <= repaired
    touched = [p.id[:12] for p in intact if p.id in repaired]
    assert touched == [], f"intact pods repaired: {touched}"
    moved = [p.id[:12] for p in intact if get_link("eth0", p.netns).index != before[p.id]["ifindex"]]
    assert moved == [], f"intact pods with another eth0: {moved}"
    alive = [p for p in pods if p.id != lost.id]
    _reach_ring(alive)

    # the bridge deleted: every pod (the lost one aside) is repaired again
    before.update({k: {**v, "kind": "bridge-deleted"} for k, v in node.snapshot(alive).items()})
    repairs = collections.Counter(op["podId"] for op in daemon.op_lines() if op["op"] == "repair")
    damaged_at = dict.fromkeys((p.id for p in alive), time.time())
    damage("bridge-deleted", alive[1], "eth0", rnode.bridge)
    print("bridge deleted:")
    _wait_whole(node, damaged_at, alive, before)
    repairs.subtract(op["podId"] for op in daemon.op_lines() if op["op"] == "repair")
    assert [p.id[:12] for p in alive if repairs[p.id] != -1] == [], "one repair each, recorded"
    assert broken_by_name(daemon) == {lost.id: "netns-unreadable"}
    _reach_ring(alive)

    rnode.remove_all_leaving_nothing([p.id for p in pods] + [warm], checker)
