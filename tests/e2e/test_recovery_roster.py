"""The runtime's list is the roster, on a real containerd 2.1.9, shim mode:

- containerd restarted and killed (-9) during a churn of pod creations and removals: afterwards
  `nri-cni pods` lists exactly the pods containerd lists, plus only pods nri-cni still holds an
  attachment or an intent record of (marked "listed": false); after every pod is removed, none.
  Before the fix it kept every pod whose RemovePodSandbox was lost with the connection (57
  after three restarts), some with no name, and `nri-cni gc` did not clear them.
- A READY pod whose netns path is unmounted and removed while its pause process keeps the
  namespace is not detached, by the reaper or by GC: its IP stays held (host-local's lease
  file is still there), and it is reported by name, broken "netns-unreadable".
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from tests.support.damage import unmount_netns_path
from tests.support.faultnode import Churn, assert_true_within_settle, wait_resynchronized
from tests.support.nricni import NriCni
from tests.support.recovery_node import RecoveryNode, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

FAULTS = ["restart", "kill9", "restart", "kill9"]


def _until(what: str, cond, daemon: NriCni, timeout: float = 60.0):
    """Waits for an event the test caused (a deadline passed is a failure, with the log)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{daemon.log_tail()}"
        time.sleep(0.05)


def _roster(daemon: NriCni) -> tuple[set[str], dict[str, dict]]:
    """`nri-cni pods`: the pods it says the runtime lists, and the others (id -> row)."""
    rows = daemon.pods()
    return {p["id"] for p in rows if p["listed"]}, {p["id"]: p for p in rows if not p["listed"]}


def _holds(rnode: RecoveryNode, row: dict) -> bool:
    """nri-cni still holds something of the pod: an attachment, or an intent record."""
    return bool(row["network-status"]) or row["id"] in rnode.intents()


def test_pods_lists_the_runtimes_pods_after_restarts_and_kills_during_a_churn(rnode):
    ctd = rnode.start_containerd()
    daemon = rnode.start_daemon(rnode.daemon_config([rnode.podnet(finalize=False)]))
    checker = rnode.leak_checker().start()
    churn = Churn(rnode, workers=4, keep_at_most=6).start()
    try:
        for n, fault in enumerate(FAULTS):
            churn.wait_created(len(churn.created) + 5)
            if fault == "kill9":
                assert ctd.kill9() == -signal.SIGKILL
                if n == len(FAULTS) - 1:
                    churn.stopping.set()
                ctd.start()
            else:
                if n == len(FAULTS) - 1:
                    churn.stopping.set()
                ctd.restart()
            wait_resynchronized(daemon, n + 2)
    finally:
        churn.stop()
    checker.add_markers(*churn.created)
    assert_true_within_settle(rnode)

    existing = {p.id for p in ctd.cri.list_pods()}
    listed, unlisted = _roster(daemon)
    print(
        f"{len(churn.created)} pods created, {len(churn.failed)} calls cut; containerd lists "
        f"{len(existing)}; nri-cni: {len(listed)} listed, {len(unlisted)} held"
    )
    assert listed == existing, (listed - existing, existing - listed)
    assert all(_holds(rnode, row) for row in unlisted.values()), unlisted
    assert daemon.ask("gc")["errors"] == []
    listed, unlisted = _roster(daemon)
    assert listed == existing
    assert all(_holds(rnode, row) for row in unlisted.values()), unlisted

    for pod in existing:
        rnode.remove_pod(pod)
    assert ctd.cri.list_pods() == []
    # pods restored by containerd's restart get no RemovePodSandbox (containerd#8426): nri-cni
    # asks for a fresh list when their teardown is not followed by one
    _until("an empty roster", lambda: _roster(daemon) == (set(), {}), daemon)
    status = daemon.status()
    assert status["broken"] == []
    assert status["tracked"]["pods"] == 0 and status["tracked"]["repair"] == 0
    assert sum(status["podStates"].values()) == 0  # no verdict of a pod that is gone
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert rnode.intents() == []
    assert checker.leaks() == []


def test_a_running_pod_whose_netns_path_vanished_is_reported_and_keeps_its_ips(rnode):
    rnode.start_containerd()
    cfg = rnode.daemon_config(
        [rnode.podnet(finalize=False)], status={"interval": "200ms"}, verify={"interval": "500ms"}
    )
    daemon = rnode.start_daemon(cfg)
    checker = rnode.leak_checker().start()
    victim = rnode.run_pod(f"ncver-lost-{uuid.uuid4().hex[:6]}", ports=False)
    intact = rnode.run_pod(f"ncver-kept-{uuid.uuid4().hex[:6]}", ports=False)
    checker.add_markers(victim, intact)
    leases = {r.ip: r for r in rnode.reserved_for(victim)}
    assert leases
    netns = rnode.ctd.cri.pod_status(victim).netns_path
    try:
        unmount_netns_path(netns)  # the pause process still holds the namespace

        def reported():
            return [b for b in daemon.status()["broken"] if b["pod"] == victim]

        (broken,) = _until("netns-unreadable report", reported, daemon)
        assert broken["code"] == "netns-unreadable"
        assert broken["name"].startswith("ncver-lost-")
        assert netns in broken["reason"]
        assert daemon.ask("gc")["deleted"] == []
        rounds = daemon.status()["verify"]["rounds"]
        # two more verify rounds: the reaper (every 200 ms) had its turns in between
        _until("two more verify rounds", lambda: daemon.status()["verify"]["rounds"] >= rounds + 2, daemon)

        assert {r.ip: r for r in rnode.reserved_for(victim)} == leases  # lease files still there
        assert [op["op"] for op in daemon.op_lines() if op["podId"] == victim] == ["add"]
        rows = {p["id"]: p for p in daemon.pods()}
        assert rows[victim]["listed"] and rows[victim]["state"] == "ready"
        assert [n["interface"] for n in rows[victim]["network-status"]] == ["eth0"]
        assert rnode.ctd.cri.pod_status(victim).ready
        assert victim in {p.id for p in rnode.runtime_pods()}
        assert [b["pod"] for b in daemon.status()["broken"]] == [victim]  # the intact one is not
        assert rows[intact]["verify"]["state"] == "ok"
    finally:
        rnode.remove_pod(victim)
    _until("the verdict forgotten", lambda: not daemon.status()["broken"], daemon)
    assert rnode.reserved_for(victim) == []
    rnode.remove_pod(intact)
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert checker.leaks() == []
