"""Acceptance 1, shim mode through containerd 2.1.9: nri-cni is killed with SIGKILL at every step
of a two-network ADD with FINALIZE (before and after each plugin, before each cache write) and
at two steps of a DEL; it is started again and synchronizes. Then nothing of the interrupted
pod is left (host-local reservations, veths, bridge ports, iptables/nft rules, cache files,
intent records) and the pod that existed all along is still fully attached.

In shim mode a daemon killed mid-ADD makes the shim fail: containerd fails the pod and tries
its CNI DEL through the shim, which finds the daemon down; the intent record is what the next
start rolls back. Killed mid-DEL, containerd's StopPodSandbox fails until the daemon is back,
and the cache entry (still there) is what the repeated stop deletes.
"""

from __future__ import annotations

import signal
import uuid

import grpc
import pytest

from tests.e2e.hostnet import netns_addrs
from tests.e2e.test_recovery_node import pod_ids_in, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

ADD_POINTS = [
    "ADD:podnet:0:before",
    "ADD:podnet:0:after",  # bridge (+ host-local)
    "ADD:podnet:1:before",
    "ADD:podnet:1:after",  # portmap
    "cache:podnet",  # eth0's chain done, not cached yet
    "ADD:fastnet:0:before",
    "ADD:fastnet:0:after",  # macvlan (+ host-local)
    "cache:fastnet",
    "FINALIZE:podnet:0:before",
    "FINALIZE:podnet:0:after",  # both networks cached
]
DEL_POINTS = ["DEL:fastnet:0:before", "DEL:podnet:1:after"]


def _assert_whole(rnode, pod_id, status):
    """Both networks attached: cache, reservations, addresses inside the pod."""
    assert pod_ids_in(rnode.daemon)[pod_id] == ["eth0", "net1"]
    assert sorted(r.ifname for r in rnode.reserved_for(pod_id)) == ["eth0", "net1"]
    assert f"{status.ip}/24" in netns_addrs(status.netns_path, "eth0")
    assert len(netns_addrs(status.netns_path, "net1")) == 1


@pytest.mark.parametrize("point", ADD_POINTS + DEL_POINTS)
def test_kill9_at_every_step_then_restart_leaves_nothing(rnode, point):
    ctd = rnode.start_containerd()
    cfg = rnode.daemon_config([rnode.podnet(), rnode.fastnet()])
    daemon = rnode.start_daemon(cfg)
    survivor = rnode.run_pod("survivor")
    survivor_st = ctd.cri.pod_status(survivor)
    daemon.stop()
    checker = rnode.leak_checker().start()  # the survivor's state is the baseline

    rnode.start_daemon(cfg, crash_at=point)
    name = f"victim-{uuid.uuid4().hex[:8]}"
    if point.startswith("DEL"):
        victim = rnode.run_pod(name)
        checker.add_markers(victim, *ctd.cri.pod_status(victim).ips)
        checker.learn()
        with pytest.raises(grpc.RpcError):
            ctd.cri.stop_pod(victim)  # the NRI stop kills the daemon; the shim's DEL fails
        assert rnode.wait_dead() == -signal.SIGKILL
        assert any(victim in f for f in rnode.cache_files())  # what the next DEL works from
    else:
        with pytest.raises(grpc.RpcError) as err:
            rnode.run_pod(name)
        assert "nri-cni daemon is not reachable" in str(err.value)
        assert rnode.wait_dead() == -signal.SIGKILL
        [victim] = rnode.intents()  # written before the first plugin ran
        checker.add_markers(victim)
        checker.learn()
        assert victim not in {p.id for p in ctd.cri.list_pods()}  # containerd failed it

    rnode.start_daemon(cfg)  # recovery, Synchronize, GC
    if point.startswith("DEL"):
        rnode.remove_pod(victim)  # kubelet retries the stop: now it goes through
    assert rnode.reserved_for(victim) == []
    assert rnode.intents() == []
    assert not [f for f in rnode.cache_files() if victim in f]
    assert checker.leaks() == []
    assert victim not in pod_ids_in(rnode.daemon)

    # the pod that lived through all of it is untouched (never ADDed again: shim mode has
    # nothing to repair), and the node still works
    _assert_whole(rnode, survivor, survivor_st)
    assert [op["op"] for op in rnode.daemon.op_lines() if op["podId"] == survivor] == ["add"]
    rnode.remove_pod(survivor)
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert rnode.bridge_ports() == []
