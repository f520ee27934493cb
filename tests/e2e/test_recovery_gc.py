"""GC from the runtime's pod list, with real containerd 2.1.9 in secondary mode (containerd's own
bridge network makes eth0; nri-cni adds net1 in NRI RunPodSandbox). Secondary mode is where
containerd removes pods without asking nri-cni: its own CNI does the pod's teardown, and a
failed or missed NRI event does not stop the removal.

- Acceptance 2: pods removed while nri-cni was down are garbage-collected when it reconnects.
- Acceptance 4 (second half): a DEL that fails is reported (to the runtime, in `nri-cni gc`
  and its exit code) and retried by GC until it succeeds.
- The reaper: a pod that lived through a containerd restart gets no NRI stop/remove from it
  (containerd#8426); once containerd removed its netns, nri-cni detaches it on its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests.support.recovery_node import pod_ids_in, rnode, wait_settled  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def _pod(rnode, prefix):
    return rnode.run_pod(f"{prefix}-{uuid.uuid4().hex[:6]}", ports=False)


def _net1_holders(rnode) -> set[str]:
    return {r.container_id for r in rnode.reservations()}


def _reaped(daemon, pod: str) -> bool:
    return any(op["op"] == "reap" and op["podId"] == pod for op in daemon.op_lines())


def test_pods_removed_while_nri_cni_was_down_are_collected_at_reconnection(rnode):
    daemon = rnode.start_secondary(rnode.fastnet())
    checker = rnode.leak_checker().start()
    keep, *gone = [_pod(rnode, "gc") for _ in range(3)]
    checker.add_markers(keep, *gone)
    assert set(pod_ids_in(daemon)) == {keep, *gone}
    assert _net1_holders(rnode) == {keep, *gone}

    daemon.stop()
    for pod in gone:  # containerd's own teardown; nri-cni hears nothing of it
        rnode.remove_pod(pod)
    assert _net1_holders(rnode) == {keep, *gone}  # net1's addresses still held

    daemon = rnode.start_daemon(daemon.cfg)  # Synchronize lists `keep` only, then GC
    assert pod_ids_in(daemon) == {keep: ["eth0", "net1"]}  # eth0: containerd's
    assert _net1_holders(rnode) == {keep}
    ops = [(op["op"], op["podId"]) for op in daemon.op_lines() if op["op"] == "gc-del"]
    assert sorted(ops) == sorted(("gc-del", p) for p in gone)

    rnode.remove_pod(keep)
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert checker.leaks() == []


def test_del_failure_is_reported_and_retried_by_gc(rnode):
    net1 = rnode.fastnet()
    net1["conflist"]["plugins"].append(rnode.ctl_plugin())
    daemon = rnode.start_secondary(net1)
    checker = rnode.leak_checker().start()
    pod = _pod(rnode, "delfail")
    checker.add_markers(pod)
    checker.learn()

    rnode.ctl("del-fail", "1")
    rnode.remove_pod(pod)  # NRI stop/remove fail; containerd only logs it and goes on
    assert pod not in {p.id for p in rnode.ctd.cri.list_pods()}
    assert "ctl: DEL fails as told" in rnode.ctd.log_path.read_text()
    assert _net1_holders(rnode) == {pod}  # macvlan's DEL never ran (ctl is last: it goes first)

    # `nri-cni gc` retries the DEL and reports that it still fails (exit status 1)
    cli = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "gc", "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 1, cli
    assert "ctl: DEL fails as told" in cli.stderr and pod in cli.stderr
    assert _net1_holders(rnode) == {pod}
    assert pod in pod_ids_in(daemon)

    rnode.ctl("del-fail", None)  # the plugin recovers; the next GC (here: on demand) succeeds
    report = daemon.ask("gc")
    assert report["errors"] == []
    assert report["deleted"] == [f"fastnet/{pod}/net1"]
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert rnode.intents() == []
    assert checker.leaks() == []


def test_reaper_detaches_pods_containerd_removed_after_its_restart(rnode):
    # status.interval drives the reaper; short here so that the test does not wait
    daemon = rnode.start_secondary(rnode.fastnet(), status={"interval": "200ms"})
    checker = rnode.leak_checker().start()
    pod = _pod(rnode, "reap")
    checker.add_markers(pod)
    st = rnode.ctd.cri.pod_status(pod)

    mark = daemon.log_path.stat().st_size
    rnode.ctd.restart()
    wait_settled(daemon, mark)  # reconnected, synchronized: the pod is listed, kept
    assert pod_ids_in(daemon) == {pod: ["eth0", "net1"]}

    rnode.remove_pod(pod)  # the new containerd sends nri-cni nothing for this pod
    assert pod not in {p.id for p in rnode.ctd.cri.list_pods()}
    # the events: the reaper's op record (its DEL is over) and the pod gone from `nri-cni pods`;
    # the plugin releases net1's lease before either, so the lease alone says too little
    deadline = time.monotonic() + 60
    while not (_reaped(daemon, pod) and pod_ids_in(daemon) == {}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _net1_holders(rnode) == set()
    assert pod_ids_in(daemon) == {}
    assert f"whose netns {st.netns_path} is gone" in daemon.log_path.read_text()
    assert [op["op"] for op in daemon.op_lines() if op["podId"] == pod] == ["add", "reap"]
    assert rnode.cache_files() == []
    assert checker.leaks() == []
