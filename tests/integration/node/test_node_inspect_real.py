"""The inspector against pods the real bridge + host-local plugins attached, damaged from outside
the way a node sees it (NetworkManager or an admin): the bridge deleted, the pod's host veth
deleted, its eth0 deleted, its address flushed, its netns gone. Each is reported with its kind by
netlink, and the host-side damage also by the chain's own CNI CHECK with the cached result."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading

import pytest

from nri_cni.errors import CNIError
from nri_cni.node import Expectation, FindingKind, NodeInspector
from nri_cni.node.workers import NetnsWorkers
from tests.support.netns import delete_link, delete_netns, get_link

pytestmark = pytest.mark.netns


def inspect(inspector, net, pods):
    return asyncio.run(inspector.inspect([net.expectation(p) for p in pods]))


def test_intact_pods_are_ok(bridge_net, inspector):
    pods = [bridge_net.attach() for _ in range(3)]
    findings = inspect(inspector, bridge_net, pods)
    assert [f.kind for f in findings] == [FindingKind.OK] * 3, [f.reason for f in findings]
    assert [f.expectation.key for f in findings] == [p.cid for p in pods]
    e = findings[0].expectation
    assert e.mac and e.addresses and bridge_net.bridge in e.host_ifnames  # there was something to compare
    for pod in pods:
        bridge_net.check(pod)  # and CHECK agrees


def test_bridge_deleted(bridge_net, inspector):
    damaged, intact = bridge_net.attach(), bridge_net.attach()
    assert delete_link(bridge_net.bridge)
    # what the node shows: the host veths stay (unenslaved, up), so the pods' eth0 are untouched;
    # only the host side tells, and the bridge is in every attachment's result
    link = damaged.ns.link("eth0")
    assert link is not None and link.up
    findings = inspect(inspector, bridge_net, [damaged, intact])
    for f in findings:
        assert f.kinds == {FindingKind.HOST_LINK_MISSING}, f.reason
        assert f"host link {bridge_net.bridge} is gone" in f.reason
    with pytest.raises(CNIError) as ei:
        bridge_net.check(damaged)
    assert ei.value.ref.command == "CHECK" and ei.value.ref.plugin == "bridge", ei.value


def test_bridge_deleted_and_made_again_by_the_next_pod(bridge_net, inspector):
    damaged = bridge_net.attach()
    assert delete_link(bridge_net.bridge)
    later = bridge_net.attach()  # the bridge plugin makes the bridge again, without the old port
    veth = damaged.host_veth(bridge_net.bridge)
    assert get_link(veth).master is None and get_link(bridge_net.bridge) is not None
    f, ok = inspect(inspector, bridge_net, [damaged, later])
    assert f.kinds == {FindingKind.PORT_DETACHED}, f.reason
    assert f"host veth {veth} is no port of {bridge_net.bridge}" in f.reason
    assert ok.ok, ok.reason
    with pytest.raises(CNIError) as ei:
        bridge_net.check(damaged)
    assert ei.value.ref.plugin == "bridge", ei.value
    bridge_net.check(later)


def test_host_veth_deleted(bridge_net, inspector):
    damaged, intact = bridge_net.attach(), bridge_net.attach()
    veth = damaged.host_veth(bridge_net.bridge)
    assert delete_link(veth)
    # a veth pair goes as a whole: the pod's eth0 went with its host end
    assert damaged.ns.link("eth0") is None
    f, ok = inspect(inspector, bridge_net, [damaged, intact])
    assert f.kind is FindingKind.LINK_MISSING, f.reason
    assert f.kinds == {FindingKind.LINK_MISSING, FindingKind.HOST_LINK_MISSING}, f.reason
    assert f"host link {veth} is gone" in f.reason
    assert ok.ok, ok.reason
    with pytest.raises(CNIError) as ei:
        bridge_net.check(damaged)
    assert ei.value.ref.plugin == "bridge", ei.value
    bridge_net.check(intact)


def test_eth0_deleted(bridge_net, inspector):
    damaged, intact = bridge_net.attach(), bridge_net.attach()
    assert delete_link("eth0", damaged.ns)
    assert get_link(damaged.host_veth(bridge_net.bridge)) is None  # the pair went as a whole
    f, ok = inspect(inspector, bridge_net, [damaged, intact])
    assert f.kinds == {FindingKind.LINK_MISSING, FindingKind.HOST_LINK_MISSING}, f.reason
    assert ok.ok, ok.reason
    with pytest.raises(CNIError):
        bridge_net.check(damaged)


def test_address_flushed(bridge_net, inspector):
    damaged, intact = bridge_net.attach(), bridge_net.attach()
    damaged.ns.run("ip", "-4", "addr", "flush", "dev", "eth0")
    f, ok = inspect(inspector, bridge_net, [damaged, intact])
    assert f.kinds == {FindingKind.ADDRESS_MISSING}, f.reason
    assert f"eth0 lacks {damaged.ip}" in f.reason
    assert ok.ok, ok.reason
    with pytest.raises(CNIError):
        bridge_net.check(damaged)


def test_extra_address_link_down_and_mac_changed(bridge_net, inspector):
    extra, down, new_mac = (bridge_net.attach() for _ in range(3))
    spare = str(bridge_net.subnet.network_address + 250)
    extra.ns.run("ip", "addr", "add", f"{spare}/24", "dev", "eth0")
    down.ns.run("ip", "link", "set", "eth0", "down")
    new_mac.ns.run("ip", "link", "set", "eth0", "address", "0a:58:00:00:00:01")
    findings = inspect(inspector, bridge_net, [extra, down, new_mac])
    assert [f.kinds for f in findings] == [
        {FindingKind.ADDRESS_EXTRA},
        {FindingKind.LINK_DOWN},
        {FindingKind.MAC_CHANGED},
    ], [f.reason for f in findings]


def test_host_veth_down_leaves_the_pod_without_carrier(bridge_net, inspector):
    pod = bridge_net.attach()
    subprocess.run(["ip", "link", "set", pod.host_veth(bridge_net.bridge), "down"], check=True)
    (f,) = inspect(inspector, bridge_net, [pod])
    assert f.kinds == {FindingKind.NO_CARRIER}, f.reason


def test_netns_gone(bridge_net, inspector, tmp_path):
    gone, intact = bridge_net.attach(), bridge_net.attach()
    assert delete_netns(gone.ns)
    not_a_netns = tmp_path / "stale-netns"  # what an unmounted bind mount leaves behind
    not_a_netns.write_text("")
    findings = asyncio.run(
        inspector.inspect(
            [
                bridge_net.expectation(gone),
                bridge_net.expectation(intact),
                Expectation(key="stale", netns=str(not_a_netns), ifname="eth0"),
            ]
        )
    )
    assert [f.kind for f in findings] == [FindingKind.NETNS_GONE, FindingKind.OK, FindingKind.NETNS_GONE]
    assert "not a network namespace" in findings[2].reason


def test_workers_return_to_their_own_netns(bridge_net):
    pods = [bridge_net.attach() for _ in range(4)]
    pool = NetnsWorkers(2)
    try:
        ins = NodeInspector(pool)
        findings = asyncio.run(ins.inspect([bridge_net.expectation(p) for p in pods] * 3))
        assert all(f.ok for f in findings), [f.reason for f in findings]
        home = os.stat("/proc/self/ns/net").st_ino

        def where() -> int:
            return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino

        seen = {pool.submit(where).result(timeout=10) for _ in range(20)}
        assert seen == {home}
    finally:
        pool.close()


def test_a_worker_that_cannot_return_home_is_replaced(bridge_net, monkeypatch):
    """A failed return to the worker's own netns (a kernel fault, provoked here) ends that worker,
    stranded in the pod's netns: that netns is reported unreadable, and the replacement, started
    by the stranded thread (threads inherit their creator's netns), goes home before any job."""
    from nri_cni.node import workers

    pod = bridge_net.attach()
    real_setns = workers._setns
    home = os.stat("/proc/self/ns/net").st_ino
    state = {"away": False, "failed": False}

    def flaky_setns(fd: int) -> None:
        going_home = os.fstat(fd).st_ino == home
        if going_home and state["away"] and not state["failed"]:  # the first way back home
            state["failed"] = True
            raise OSError(1, "provoked")
        real_setns(fd)
        state["away"] = not going_home

    monkeypatch.setattr(workers, "_setns", flaky_setns)
    pool = NetnsWorkers(1)
    try:
        ins = NodeInspector(pool)
        (f,) = asyncio.run(ins.inspect([bridge_net.expectation(pod)]))
        assert f.kind is FindingKind.UNREADABLE and "cannot return to its own netns" in f.reason, f.reason
        (f,) = asyncio.run(ins.inspect([bridge_net.expectation(pod)]))
        assert f.ok, f.reason
        assert pool._started == 2  # the stranded worker was replaced

        def where() -> int:
            return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino

        assert pool.submit(where).result(timeout=10) == home
    finally:
        pool.close()


def test_two_interfaces_in_one_netns(bridge_net, second_net, inspector):
    eth0 = bridge_net.attach()
    net1 = second_net.attach(eth0.ns, ifname="net1")
    exps = [bridge_net.expectation(eth0), second_net.expectation(net1)]
    assert [f.ok for f in asyncio.run(inspector.inspect(exps))] == [True, True]
    assert delete_link("net1", eth0.ns)
    f0, f1 = asyncio.run(inspector.inspect(exps))
    assert f0.ok, f0.reason
    assert f1.kinds == {FindingKind.LINK_MISSING, FindingKind.HOST_LINK_MISSING}, f1.reason


def test_host_side_unreadable_is_said(bridge_net, inspector, monkeypatch):
    from nri_cni.node import inspector as inspector_module

    pod = bridge_net.attach()

    def broken(names):
        raise OSError(105, "No buffer space available")

    monkeypatch.setattr(inspector_module, "_host_links", broken)
    (f,) = inspect(inspector, bridge_net, [pod])
    assert f.kinds == {FindingKind.UNREADABLE} and "cannot read host links" in f.reason, f.reason
    assert not f.damaged


@pytest.mark.parametrize(
    "pods, jobs", [(1, 1), (3, 2)], ids=["one-pod-one-job", "control-three-pods-two-workers"]
)
def test_one_pods_look_is_one_job_with_its_host_links(bridge_net, pods, jobs):
    """A look at one pod (a CRI-O CHECK answered from the records) is one hop to a worker: its
    host links and its netns read by one job. Control: three pods on two workers are two jobs,
    the host links read by the first before it joins the other in draining the namespaces."""
    attached = [bridge_net.attach() for _ in range(pods)]
    pool = NetnsWorkers(2)
    submitted: list[str] = []
    submit = pool.submit

    def counted(fn, *args):
        submitted.append(fn.__name__)
        return submit(fn, *args)

    pool.submit = counted  # type: ignore[method-assign]
    try:
        findings = asyncio.run(NodeInspector(pool).inspect([bridge_net.expectation(p) for p in attached]))
        assert all(f.ok for f in findings), [f.reason for f in findings]
        assert bridge_net.bridge in findings[0].expectation.host_ifnames  # host links were read
        assert submitted == ["_host_links_then_drain", "_drain"][:jobs]
    finally:
        pool.close()
