"""Secondary mode through real containerd 2.1.9: the FINALIZE of containerd's own eth0 runs once
for every pod, with an operation record, whether or not the pod has a network of nri-cni's,
and never again for a pod already finalized: not on nri-cni's restart and
the repair after its Synchronize.

The FINALIZE plugin is the test's own probe drop-in (test_pod_secondary.PROBE): one line per call.
Subnets: 10.246.144.0/24 and 10.246.145.0/24.
"""

from __future__ import annotations

import pytest

from tests.support.hostlocal import host_local_reservations
from tests.support.secondarynode import NAMESPACE

pytestmark = pytest.mark.e2e


def _eth0_finalizes(node, pod: str) -> int:
    return sum(1 for verb, ifname, _ in node.probe_calls(pod) if (verb, ifname) == ("FINALIZE", "eth0"))


def test_every_pod_gets_one_finalize_of_the_runtime_primary_with_an_op_record(make_secondary_node):
    node = make_secondary_node(("10.246.144.0/24", "10.246.145.0/24"))
    net = node.fastnet()
    net["default"] = False  # only the pods that ask for it get net1
    net["namespaces"] = [NAMESPACE]
    daemon = node.start(net)
    plain = [node.run_pod("fin-plain") for _ in range(3)]
    extra = node.run_pod("fin-extra", ["fastnet"])
    pods = [*plain, extra]
    for pod in pods:
        st = node.ctd.cri.pod_status(pod)
        node.leaks.add_markers(pod, st.ip)
        assert st.ready
    for pod in plain:
        assert node.probe_calls(pod) == [("FINALIZE", "eth0", "eth0,lo")]
    assert node.probe_calls(extra) == [
        ("FINALIZE", "eth0", "eth0,lo,net1"),
        ("FINALIZE", "net1", "eth0,lo,net1"),
    ], daemon.log_tail()
    # one operation record per pod, the primary's FINALIZE in it
    adds = {op["podId"]: op for op in daemon.op_lines() if op["op"] == "add"}
    assert set(adds) == set(pods), daemon.op_lines()
    for pod in plain:
        assert adds[pod]["result"] == "ok"
        assert [(n["network"], n["op"]) for n in adds[pod]["networks"]] == [(node.primary.name, "finalize")]
    assert [(n["network"], n["op"]) for n in adds[extra]["networks"]] == [
        ("fastnet", "add"),
        (node.primary.name, "finalize"),
        ("fastnet", "finalize"),
    ]
    node.leaks.learn()

    # A restart of nri-cni: Synchronize lists every pod and repair looks at each; the pods are
    # finalized already, nothing runs again and no new operation is recorded.
    daemon.stop()
    daemon.start()
    daemon.wait_idle()
    for pod in pods:
        assert _eth0_finalizes(node, pod) == 1, node.probe_calls(pod)
    assert sorted(op["podId"] for op in daemon.op_lines() if op["op"] == "add") == sorted(pods)

    for pod in pods:
        node.remove_pod(pod)
    assert host_local_reservations(node.setup.ipam_dir) == []
    assert daemon.pods() == []
    # the marks of finalized pods go with the pods
    assert node.leaks.leaks() == []
