"""Written once, run on containerd and on CRI-O (where it is installed): nri-cni killed by PID
in the middle of a churn while pods come and go (secondary mode: the runtime goes on without the
plugin), and nri-cni restarted with pods attached (ready, every pod verified, none repaired).
Acceptance as in the fault tests: every pod the runtime lists READY whole, `nri-cni pods` lists
exactly the runtime's pods, and nothing left once they are removed."""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from tests.support.crionode import runtime_leaks, runtime_node, start_secondary  # noqa: F401 (fixture)
from tests.support.faultnode import Churn, assert_true_within_settle
from tests.support.recovery_node import wait_settled

pytestmark = pytest.mark.e2e


def test_nri_cni_killed_in_a_churn_pods_come_and_go_while_it_is_down(runtime_node):
    node = runtime_node
    daemon, runtime, checker = start_secondary(node, node.fastnet())
    churn = Churn(node).start()
    try:
        churn.wait_created(8)
        assert node.kill9() == -signal.SIGKILL
        # the runtime goes on without the plugin: pods are made (eth0 only) and removed meanwhile
        churn.wait_created(len(churn.created) + 8)
    finally:
        churn.stop()
    assert churn.failed == []  # the runtime itself was never down
    for pod in churn.kept[:2]:  # two pods that had net1 (or not) go while nri-cni is down
        node.remove_pod(pod)
    mark = daemon.log_path.stat().st_size
    daemon.start(wait_registered=True)
    wait_settled(daemon, mark)
    created = list(churn.created)
    checker.add_markers(*created)
    listed = {p.id for p in runtime.cri.list_pods()}
    # the roster: nri-cni reports exactly the runtime's pods, none it removed meanwhile
    assert {p["id"] for p in daemon.pods()} == listed
    took = assert_true_within_settle(node, interfaces=("eth0", "net1"))
    print(
        f"{node.runtime_name}: {len(created)} pods created, it lists {len(listed)}; whole {took:.2f} s after the restart"
    )
    for pod in listed:
        node.remove_pod(pod)
    assert node.reservations() == [] and node.primary.reservations() == {}
    assert node.cache_files() == [] and node.intents() == []
    assert daemon.pods() == []
    assert runtime_leaks(runtime, created) == []
    assert checker.leaks() == []


def test_nri_cni_restart_with_pods_attached_repairs_nothing(runtime_node):
    node = runtime_node
    runtime = node.start_containerd()
    cfg = node.daemon_config([node.podnet(finalize=False)])
    daemon = node.start_daemon(cfg)
    checker = node.leak_checker().start()
    pods = [node.run_pod(f"keep-{i}-{uuid.uuid4().hex[:4]}", ports=False) for i in range(6)]
    checker.add_markers(*pods)
    checker.learn()
    daemon.stop()
    mark = daemon.log_path.stat().st_size
    t0 = time.monotonic()
    node.start_daemon(cfg)  # registered, synchronized, GC done, no repair pending
    ready = time.monotonic() - t0
    deadline = time.monotonic() + 60
    while not daemon.status()["verify"]["verified"]:  # the verify round after the Synchronize
        assert time.monotonic() < deadline, daemon.log_tail()
        time.sleep(0.05)
    verified = time.monotonic() - t0
    status = daemon.status()
    print(
        f"{node.runtime_name}, {len(pods)} pods: ready {ready:.2f} s, verified {verified:.2f} s; {status['podStates']}"
    )
    assert status["pendingRepair"] == [] and status["broken"] == []
    with open(daemon.log_path, "rb") as f:
        f.seek(mark)
        assert b" repaired: " not in f.read()  # none repaired needlessly
    assert node.not_whole(("eth0",)) == []
    assert {p["id"] for p in daemon.pods()} == set(pods)
    for pod in pods:
        node.remove_pod(pod)
    assert runtime_leaks(runtime, pods) == []
    assert node.reservations() == [] and checker.leaks() == []
