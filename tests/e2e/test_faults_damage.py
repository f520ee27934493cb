"""External damage on a real containerd, shim and secondary mode: the CNI
bridge deleted, a pod's host veth deleted, its interface deleted, its address flushed. Within one
verify period (a short `verify.interval`, netlink and CNI CHECK every round) plus the repair's own
time, every damaged pod has its interfaces back with the same IPs (netlink, containerd's IPs
included), the host ends on the bridge again, an operation record "repair" names it, and the pods
reach each other; or nri-cni names it broken, which no kind of damage here calls for. After the
pods are removed nothing is left.
"""

from __future__ import annotations

import copy
import time

import pytest

from tests.support.damage import KINDS, damage, damage_left
from tests.support.faultnode import broken_by_name
from tests.support.podtruth import RuntimePod, pod_interfaces, reaches, whole_problems
from tests.support.recovery_node import RecoveryNode, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

VERIFY = {"interval": "1s", "check_every": 1}
# the damage is repaired in the next verify round (1 s): the test waits for that, with a deadline
# for a hang only (one repair, DEL + ADD of a chain, FINALIZE, is a second or two on a quiet machine)
REPAIR_DEADLINE = 120.0


def _pods(rnode: RecoveryNode, count: int = 2) -> list[RuntimePod]:
    ids = [rnode.run_pod(f"dmg-{i}", ports=i == 0) for i in range(count)]
    return [p for p in rnode.runtime_pods() if p.id in ids]


def _baseline(rnode: RecoveryNode):
    """The leak baseline, taken with a first pod with a host port on the node: portmap's shared
    chains (CNI-HOSTPORT-*, never removed by portmap) exist before the pods under test."""
    warm = rnode.run_pod("dmg-warm", ports=True)
    return warm, rnode.leak_checker().start()


def _wait_repaired(rnode: RecoveryNode, pods, before, ifname: str, interfaces) -> float:
    """Polls (read-only) until every pod is whole again (REPAIR_DEADLINE: a hang); returns the seconds."""
    t0 = time.monotonic()
    while True:
        problems = []
        for pod in pods:
            problems += damage_left(pod, before[pod.id], [ifname], rnode.bridge)
            problems += whole_problems(pod, interfaces)
        if not problems:
            return time.monotonic() - t0
        if time.monotonic() - t0 > REPAIR_DEADLINE:
            broken = broken_by_name(rnode.daemon)
            raise AssertionError(f"{problems}\nbroken: {broken}\n{rnode.daemon.log_tail(60)}")
        time.sleep(0.05)


def _after_the_repair(rnode: RecoveryNode, pods, damaged, ifname: str, checker, warm: str) -> None:
    assert broken_by_name(rnode.daemon) == {}
    repaired = {op["podId"] for op in rnode.daemon.op_lines() if op["op"] == "repair"}
    assert {p.id for p in damaged} <= repaired, "every repair writes an operation record"
    a, b = pods
    assert reaches(a, pod_interfaces(b.netns)[ifname][0].split("/")[0])
    assert reaches(b, pod_interfaces(a.netns)[ifname][0].split("/")[0])
    rnode.remove_all_leaving_nothing([p.id for p in pods] + [warm], checker)


@pytest.mark.parametrize("kind", KINDS)
def test_external_damage_is_repaired_shim(rnode, kind):
    rnode.start_containerd()
    rnode.start_daemon(rnode.daemon_config([rnode.podnet(finalize=False)], verify=VERIFY))
    warm, checker = _baseline(rnode)
    pods = _pods(rnode)
    checker.add_markers(*(p.id for p in pods), *(ip for p in pods for ip in p.ips))
    checker.learn()
    before = {p.id: pod_interfaces(p.netns) for p in pods}
    damage(kind, pods[0], "eth0", rnode.bridge)
    damaged = pods if kind == "bridge-deleted" else pods[:1]
    took = _wait_repaired(rnode, pods, before, "eth0", ["eth0"])
    print(f"{kind}: repaired {took:.2f} s after the damage")
    _after_the_repair(rnode, pods, damaged, "eth0", checker, warm)


def _net1(rnode: RecoveryNode) -> dict:
    """nri-cni's own network in secondary mode: the test bridge in the second subnet (net1)."""
    net = copy.deepcopy(rnode.podnet(finalize=False))
    net["conflist"]["plugins"][0]["ipam"]["ranges"] = [[{"subnet": rnode.net1_subnet}]]
    return net


@pytest.mark.parametrize("kind", KINDS)
def test_external_damage_is_repaired_secondary(rnode, kind):
    rnode.start_secondary(_net1(rnode), verify=VERIFY)
    warm, checker = _baseline(rnode)
    pods = _pods(rnode)
    checker.add_markers(*(p.id for p in pods))
    checker.learn()
    before = {p.id: pod_interfaces(p.netns) for p in pods}
    assert all(sorted(b) == ["eth0", "net1"] for b in before.values())
    damage(kind, pods[0], "net1", rnode.bridge)
    damaged = pods if kind == "bridge-deleted" else pods[:1]
    took = _wait_repaired(rnode, pods, before, "net1", ["eth0", "net1"])
    print(f"{kind}: repaired {took:.2f} s after the damage")
    _after_the_repair(rnode, pods, damaged, "net1", checker, warm)
