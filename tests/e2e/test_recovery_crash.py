"""kill -9 of nri-cni from outside, shim mode through containerd 2.1.9: while a plugin of an ADD,
a FINALIZE, a DEL, a GC or a rollback runs, and during start-up recovery. The block plugin holds
the call (tests/plugins/block_plugin.py); the test kills nri-cni by PID, lets the orphaned plugin
finish into a dead pipe, starts nri-cni again, and then finds on the node (netlink, host-local's
dir, the cache and intent dirs, firewall rules): nothing of the interrupted pod, and every pod
containerd lists READY with exactly its networks and the IPs containerd reports. With real
containers in the pods (tests/support/busybox.py), their status directories go with their pods and
a container created after the restart reads what one created before read.

In shim mode a daemon killed mid-ADD makes the shim fail: containerd fails the pod and tries its
CNI DEL through the shim, which finds the daemon down; the intent record is what the next start
rolls back. Killed mid-DEL, containerd's StopPodSandbox fails until the daemon is back, and the
cache entry (still there) is what the repeated stop deletes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest

from nri_cni.local.codec import LocalProtocolError
from tests.plugins.block_plugin import Blocked
from tests.support.busybox import build_busybox_image, pod_for_containers, status_reading_container
from tests.support.damage import damage_left
from tests.support.netns import delete_link
from tests.support.podtruth import pod_interfaces
from tests.support.recovery_node import RecoveryNode, pod_ids_in, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def _victim_name() -> str:
    return f"victim-{uuid.uuid4().hex[:8]}"


class Scene:
    """A node with a survivor pod (fully attached before the fault) and a leak baseline."""

    def __init__(self, rnode: RecoveryNode, podnet: dict, **extra) -> None:
        self.rnode = rnode
        self.ctd = rnode.start_containerd()
        self.cfg = rnode.daemon_config([podnet, rnode.fastnet()], **extra)
        rnode.start_daemon(self.cfg)
        self.survivor = rnode.run_pod("survivor")
        self.checker = rnode.leak_checker().start()  # the survivor's state is the baseline
        self.pool = ThreadPoolExecutor(2)

    def in_background(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)

    def kill_while_blocked(self, blocked: Blocked) -> None:
        """kill -9 of nri-cni while `blocked` holds its call; then the plugin goes on, orphaned."""
        assert blocked.ppid == self.rnode.daemon.proc.pid  # nri-cni runs it
        assert self.rnode.kill9() == -signal.SIGKILL
        assert blocked.alive()  # the plugin outlived the daemon ...
        self.rnode.block.disarm()
        self.rnode.block.release(blocked)  # ... and ends writing into a dead pipe

    def restarted(self) -> None:
        self.rnode.start_daemon(self.cfg)  # recovery, Synchronize, GC

    def assert_truth(self, gone: str) -> None:
        """Nothing of `gone` is left; the survivor is whole and untouched; every READY pod whole."""
        rnode = self.rnode
        assert gone not in {p.id for p in self.ctd.cri.list_pods()}
        assert rnode.reserved_for(gone) == []
        assert rnode.intents() == []
        assert not [f for f in rnode.cache_files() if gone in f]
        assert gone not in pod_ids_in(rnode.daemon)
        assert self.checker.leaks() == []
        assert rnode.not_whole() == []
        assert {p.id for p in rnode.runtime_pods()} == {self.survivor}
        assert sorted(r.ifname for r in rnode.reserved_for(self.survivor)) == ["eth0", "net1"]
        # never ADDed again: the restart found it whole
        assert [op["op"] for op in rnode.daemon.op_lines() if op["podId"] == self.survivor] == ["add"]
        rnode.remove_pod(self.survivor)
        assert rnode.reservations() == []
        assert rnode.cache_files() == []
        assert rnode.bridge_ports() == []
        self.pool.shutdown()


def _kill_during_stop(scene: Scene, victim: str) -> None:
    """A pod stop whose DEL plugin is held when nri-cni is killed; then nri-cni starts again."""
    scene.checker.learn()
    scene.rnode.block.arm()
    stopping = scene.in_background(scene.ctd.cri.stop_pod, victim)
    scene.kill_while_blocked(scene.rnode.block.wait_blocked("DEL", victim))
    with pytest.raises(grpc.RpcError):
        stopping.result(60)  # the NRI stop (or the shim's DEL) lost its daemon
    assert any(victim in f for f in scene.rnode.cache_files())  # what the next DEL works from
    scene.restarted()


def _kill_during_add(scene: Scene, command: str) -> str:
    """A pod creation whose `command` (ADD or FINALIZE) is held when nri-cni is killed."""
    rnode = scene.rnode
    rnode.block.arm()
    creation = scene.in_background(rnode.run_pod, _victim_name())
    blocked = rnode.block.wait_blocked(command)
    victim = blocked.container_id
    assert rnode.intents() == [victim]  # written before the first plugin ran
    scene.checker.add_markers(victim)
    scene.checker.learn()
    scene.kill_while_blocked(blocked)
    with pytest.raises(grpc.RpcError) as err:
        creation.result(60)
    assert "nri-cni daemon is not reachable" in str(err.value)
    assert victim not in {p.id for p in scene.ctd.cri.list_pods()}  # containerd failed it
    return victim


def test_kill9_while_an_add_plugin_runs(rnode):
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("ADD")])  # after bridge and portmap
    scene = Scene(rnode, podnet)
    victim = _kill_during_add(scene, "ADD")
    scene.restarted()
    scene.assert_truth(victim)


def test_kill9_while_a_finalize_plugin_runs(rnode):
    podnet = rnode.podnet()
    podnet["conflist"]["finalize_plugins"].append(rnode.block_plugin("FINALIZE"))
    scene = Scene(rnode, podnet)
    victim = _kill_during_add(scene, "FINALIZE")
    scene.restarted()
    scene.assert_truth(victim)


def test_kill9_while_a_rollback_runs(rnode):
    """The chain's last plugin refuses the ADD; the rollback's DEL is held when nri-cni dies."""
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("DEL"), rnode.ctl_plugin()])
    scene = Scene(rnode, podnet)
    rnode.ctl("add-code", "11")
    rnode.block.arm()
    creation = scene.in_background(rnode.run_pod, _victim_name())
    blocked = rnode.block.wait_blocked("DEL")
    victim = blocked.container_id
    assert [c[0] for c in rnode.ctl_calls() if c[1] == victim][:1] == ["ADD"]  # refused: rolling back
    assert rnode.intents() == [victim]
    scene.checker.add_markers(victim)
    scene.checker.learn()
    scene.kill_while_blocked(blocked)
    rnode.ctl("add-code", None)
    with pytest.raises(grpc.RpcError):
        creation.result(60)
    scene.restarted()
    scene.assert_truth(victim)


def test_kill9_while_a_del_plugin_runs(rnode):
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("DEL")])
    scene = Scene(rnode, podnet)
    victim = rnode.run_pod(_victim_name())
    scene.checker.add_markers(victim, *scene.ctd.cri.pod_status(victim).ips)
    _kill_during_stop(scene, victim)
    rnode.remove_pod(victim)  # kubelet retries the stop: now it goes through
    scene.assert_truth(victim)


STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"


def test_kill9_while_a_del_plugin_runs_with_containers(rnode):
    """The same kill -9 in a pod's DEL, its pods with real containers (docs/containers.md): once
    the repeated stop goes through the killed pod's status directory is gone, and nothing else is
    left of it; a container created after the restart in another pod gets the annotation and the
    file a container created before the kill got."""
    image = build_busybox_image()
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("DEL")])
    scene = Scene(rnode, podnet)
    scene.ctd.import_image(image.archive)
    scene.ctd._wait_image(image.ref)
    status_dirs = rnode.setup.state_dir / "containers"
    keeper, keeper_sandbox = pod_for_containers(scene.ctd.cri)
    victim, victim_sandbox = pod_for_containers(scene.ctd.cri)
    before_cid, before = status_reading_container(scene.ctd.cri, keeper, keeper_sandbox, image)
    status_reading_container(scene.ctd.cri, victim, victim_sandbox, image)
    assert sorted(os.listdir(status_dirs)) == sorted([keeper, victim])
    for pod in (keeper, victim):
        scene.checker.add_markers(pod, *scene.ctd.cri.pod_status(pod).ips)
    _kill_during_stop(scene, victim)

    after_cid, after = status_reading_container(scene.ctd.cri, keeper, keeper_sandbox, image)
    assert after == before
    assert [e["interface"] for e in after] == ["eth0", "net1"]
    annotations = [
        scene.ctd.cri.container_status(cid)[1]["info"]["runtimeSpec"]["annotations"][STATUS_ANNOTATION]
        for cid in (before_cid, after_cid)
    ]
    assert json.loads(annotations[0]) == json.loads(annotations[1]) == before

    rnode.remove_pod(victim)  # kubelet retries the stop: now it goes through
    assert os.listdir(status_dirs) == [keeper]
    rnode.remove_pod(keeper)
    assert os.listdir(status_dirs) == []
    scene.assert_truth(victim)


def test_kill9_while_a_gc_plugin_runs(rnode):
    """A GC killed in a plugin's GC call loses no valid attachment and leaves nothing behind."""
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("GC")])
    scene = Scene(rnode, podnet)
    rnode.block.arm()
    collecting = scene.in_background(rnode.daemon.ask, "gc")
    blocked = rnode.block.wait_blocked("GC")
    scene.kill_while_blocked(blocked)
    with pytest.raises(LocalProtocolError, match="closed the connection"):  # not a timeout
        collecting.result(60)
    scene.restarted()
    scene.assert_truth("no-such-pod")


def test_kill9_during_start_up_recovery(rnode):
    """Killed mid-ADD, then killed again while the next start's recovery DEL runs: the third
    start finishes the rollback."""
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("ADD", "DEL")])
    scene = Scene(rnode, podnet)
    rnode.block.arm()
    creation = scene.in_background(rnode.run_pod, _victim_name())
    blocked = rnode.block.wait_blocked("ADD")
    victim = blocked.container_id
    scene.checker.add_markers(victim)
    scene.checker.learn()
    assert rnode.kill9() == -signal.SIGKILL
    rnode.block.release(blocked)  # still armed: the recovery's DEL will block
    with pytest.raises(grpc.RpcError):
        creation.result(60)
    rnode.spawn_daemon(scene.cfg)
    recovering = rnode.block.wait_blocked("DEL", victim)
    assert "rolled back" not in rnode.daemon.log_tail()
    assert rnode.intents() == [victim]
    scene.kill_while_blocked(recovering)
    scene.restarted()
    assert "rolled back 1 interrupted ADD(s) at start-up" in rnode.daemon.log_tail(400)
    scene.assert_truth(victim)


def test_kill9_while_a_repair_runs(rnode):
    """Verify finds a pod's eth0 deleted; its repair (DEL, then ADD asking for the same IP) is
    held in the ADD when nri-cni dies. The next start's verify repairs it again: same IPs."""
    podnet = rnode.podnet(extra_plugins=[rnode.block_plugin("ADD")])
    scene = Scene(rnode, podnet, verify={"interval": "1s"})
    victim = rnode.run_pod(_victim_name())
    [pod] = [p for p in rnode.runtime_pods() if p.id == victim]
    scene.checker.add_markers(victim, *pod.ips)
    scene.checker.learn()
    before = pod_interfaces(pod.netns)
    rnode.block.arm()
    assert delete_link("eth0", pod.netns)  # the damage; the repair's ADD will be held
    blocked = rnode.block.wait_blocked("ADD", victim)
    assert [op["op"] for op in rnode.daemon.op_lines() if op["podId"] == victim] == ["add"]  # in flight
    scene.kill_while_blocked(blocked)
    scene.restarted()

    def ops() -> list[str]:
        return [op["op"] for op in rnode.daemon.op_lines() if op["podId"] == victim]

    # the restarted daemon's verify round (1 s interval) repairs it; the repair's record is
    # written when the operation ends, a moment after the pod is whole: both are waited for
    deadline = time.monotonic() + 120
    while damage_left(pod, before, ["eth0"], rnode.bridge) or "repair" not in ops():  # (read-only polling)
        assert time.monotonic() < deadline, (damage_left(pod, before, ["eth0"], rnode.bridge), ops())
        time.sleep(0.05)
    assert rnode.not_whole() == []
    assert rnode.intents() == []
    rnode.remove_pod(victim)
    scene.assert_truth(victim)
