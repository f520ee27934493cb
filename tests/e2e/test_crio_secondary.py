"""Secondary mode on a real CRI-O 1.36: CRI-O's own bridge network makes eth0 (its list in
CRI-O's network dir, named in a drop-in after the shipped one); nri-cni adds net1 (macvlan
over a veth master the test made) on NRI RUN_POD_SANDBOX and runs FINALIZE for both, eth0's
result read from CRI-O's libcni cache (/var/lib/cni/results).

What differs from containerd: CRI-O sends NRI STOP_POD_SANDBOX after its CNI DEL and after it
unpinned the netns, so nri-cni's DEL of net1 runs with a netns that no longer exists (a normal
DEL: the IPAM lease and cache entry go all the same); a RemovePodSandbox without a stop sends
no STOP at all, only REMOVE; a RUN that nri-cni fails is followed at once by STOP and REMOVE,
then CRI-O's own rollback (CNI DEL). CRI-O removes a sandbox whose NRI RUN failed, so
`failure_policy: auto` fails the pod there (measured here: nothing of it is left).
"""

from __future__ import annotations

import ipaddress
import os

import grpc
import pytest

from tests.support.crionode import crio_rnode, runtime_leaks, start_secondary  # noqa: F401 (fixture)
from tests.support.finalize_probe import probe_calls
from tests.support.names import unique_name
from tests.support.podtruth import whole_problems

pytestmark = pytest.mark.e2e


def _net1_ops(daemon, pod: str, op: str) -> list[dict]:
    return [o for o in daemon.op_lines() if o["podId"] == pod and o["op"] == op and o["networks"]]


def _assert_gone_clean(node, checker, pods) -> None:
    assert node.reservations() == []  # nri-cni's net1 leases
    assert node.primary.reservations() == {}  # CRI-O's eth0 leases
    assert node.cache_files() == [] and node.intents() == []
    assert os.listdir(f"/sys/class/net/{node.primary.bridge}/brif") == []
    assert node.daemon.pods() == []
    assert runtime_leaks(node.ctd, pods) == []
    assert checker.leaks() == []


def test_crio_eth0_net1_finalize_both_and_release_after_the_netns_is_gone(crio_rnode):
    node = crio_rnode
    daemon, crio, checker = start_secondary(node, node.fastnet())
    pods = [node.run_pod(f"sec-{i}", ports=False) for i in range(3)]
    statuses = {p: crio.cri.pod_status(p) for p in pods}
    checker.add_markers(*pods, *(st.ip for st in statuses.values()))
    runtime = {p.id: p for p in node.runtime_pods()}
    table = {p["id"]: p for p in daemon.pods()}
    for pod, st in statuses.items():
        assert st.ready
        assert ipaddress.ip_address(st.ip) in ipaddress.ip_network(node.primary.subnet)  # CRI-O's
        assert whole_problems(runtime[pod], ["eth0", "net1"]) == []
        # CRI-O's cache holds its eth0; nri-cni's holds net1 only
        assert [p.name for p in crio.cni_cache_entries(pod)] == [f"{node.primary.name}-{pod}-eth0"]
        assert [f for f in node.cache_files() if pod in f] == [f"fastnet-{pod}-net1"]
        # FINALIZE for CRI-O's eth0 (from its libcni cache), then for net1, both links there
        assert probe_calls(node.probe_log, pod) == [
            ("FINALIZE", "eth0", "eth0,lo,net1"),
            ("FINALIZE", "net1", "eth0,lo,net1"),
        ]
        status = table[pod]["network-status"]
        assert [(n["name"], n["interface"]) for n in status] == [
            (node.primary.name, "eth0"),
            ("fastnet", "net1"),
        ]
        assert status[0]["ips"] == [st.ip]
    checker.learn()
    assert len(node.reservations()) == 3

    # stop: CRI-O's CNI DEL, the netns unpinned, only then NRI STOP: nri-cni's DEL of net1
    # finds no netns and releases the lease and the cache entry all the same
    first = pods[0]
    pin = statuses[first].netns_path
    crio.cri.stop_pod(first)
    assert not os.path.exists(pin)
    assert node.reserved_for(first) == []
    assert [f for f in node.cache_files() if first in f] == []
    dels = _net1_ops(daemon, first, "del")
    assert len(dels) == 1 and dels[0]["result"] == "ok", dels
    assert [(n["network"], n["op"]) for n in dels[0]["networks"]] == [("fastnet", "del")]
    # the other pods are untouched
    assert all(whole_problems(runtime[p], ["eth0", "net1"]) == [] for p in pods[1:])
    crio.cri.remove_pod(first)
    for pod in pods[1:]:
        node.remove_pod(pod)
    assert all(o["result"] == "ok" for o in daemon.op_lines() if o["podId"] in pods)
    _assert_gone_clean(node, checker, pods)


def test_remove_without_stop_releases_net1(crio_rnode):
    node = crio_rnode
    daemon, crio, checker = start_secondary(node, node.fastnet())
    pod = node.run_pod("nostop", ports=False)
    checker.add_markers(pod, crio.cri.pod_status(pod).ip)
    checker.learn()
    assert len(node.reserved_for(pod)) == 1
    crio.cri.remove_pod(pod)  # CNI DEL, netns gone, NRI REMOVE only (no STOP)
    assert crio.cri.list_pods() == []
    assert [o["result"] for o in _net1_ops(daemon, pod, "del")] == ["ok"]
    _assert_gone_clean(node, checker, [pod])


@pytest.mark.parametrize("policy", ["auto", "fail"])
def test_net1_failure_on_run_fails_the_pod_and_crio_keeps_no_sandbox(crio_rnode, policy):
    node = crio_rnode
    missing = unique_name("mm")  # a master that does not exist
    net1 = node.fastnet()
    net1["conflist"]["plugins"][0]["master"] = missing
    daemon, crio, checker = start_secondary(node, net1, failure_policy=policy)
    with pytest.raises(grpc.RpcError) as err:
        node.run_pod("fail", ports=False)
    msg = str(err.value)
    assert "network 'fastnet', plugin 'macvlan', ADD: Link not found" in msg, msg
    (pod,) = {o["podId"] for o in daemon.op_lines() if o["op"] == "add" and o["result"] == "error"}
    checker.add_markers(pod)
    # CRI-O sent STOP and REMOVE at once, then rolled its own network back: no sandbox kept
    # (so `auto` fails the pod on CRI-O: nothing leaks), no netns pin, no lease, no cache entry
    assert crio.cri.list_pods() == []
    assert not (node.setup.state_dir / "intents" / pod).exists()
    assert probe_calls(node.probe_log, pod) == []  # rolled back before any FINALIZE: net1's ADD failed
    _assert_gone_clean(node, checker, [pod])
