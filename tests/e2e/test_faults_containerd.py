"""containerd faults on a real containerd 2.1.9, shim mode: kill -9 of
containerd in the middle of a churn of pod creations and removals, several rounds in one test,
with and without a slow second NRI plugin; and containerd killed between the shim's ADD and the
end of RunPodSandbox (held by a plugin after the shim in containerd's own CNI list, or by the
slow NRI plugin).

Acceptance after each: within 5 s of nri-cni's reconnect every pod containerd lists READY has
exactly its networks in its netns with the IPs containerd reports (netlink), or nri-cni names it
broken for a listed reason; the pods reach each other; and once every pod is removed nothing is
left: no reservation, link, bridge port, firewall rule, cache or intent file.
"""

from __future__ import annotations

import json
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.support.faultnode import (
    CHURN_FAULTS,
    ROUNDS,
    Churn,
    SlowNri,
    assert_nothing_left_after_removal,
    assert_pods_reach_each_other,
    assert_true_within_settle,
    broken_by_name,
    churn_through_runtime_faults,
    synchronizations,
    wait_resynchronized,
)
from tests.support.recovery_node import RecoveryNode, pod_ids_in, rnode  # noqa: F401 (fixture)
from tests.support.stubthread import StubThread

pytestmark = pytest.mark.e2e


def _start(rnode: RecoveryNode, slow: bool):
    ctd = rnode.start_containerd()
    daemon = rnode.start_daemon(rnode.daemon_config([rnode.podnet(finalize=False)]))
    stub = None
    if slow:  # registered after nri-cni (index 20): each RunPodSandbox waits for it too
        slow_nri = SlowNri(delay=0.2)
        stub = StubThread(slow_nri, name="slow", idx="20", socket_path=ctd.nri_socket).start()
        stub.wait_synchronized()
    return ctd, daemon, stub


def _whole_ready_pods(rnode: RecoveryNode):
    broken = broken_by_name(rnode.daemon)
    return [p for p in rnode.runtime_pods() if p.id not in broken]


@pytest.mark.parametrize("slow", [False, True], ids=["alone", "slow-nri-plugin"])
def test_containerd_killed_in_the_middle_of_a_churn_repeatedly(rnode, slow):
    ctd, daemon, stub = _start(rnode, slow)
    checker = rnode.leak_checker().start()
    churn = Churn(rnode).start()
    try:
        churn_through_runtime_faults(
            rnode, churn, CHURN_FAULTS, after_restart=(lambda: stub.wait_synchronized(30)) if stub else None
        )
        checker.add_markers(*churn.created)
        print(
            f"{len(churn.created)} pods created, {len(churn.failed)} calls cut; containerd lists "
            f"{len(ctd.cri.list_pods())}, broken: {broken_by_name(daemon)}"
        )
        took = assert_true_within_settle(rnode)
        print(f"node true {took:.2f} s after the last reconnect")
        assert set(churn.kept) <= {p.id for p in ctd.cri.list_pods()}  # kept pods live through it
        assert_pods_reach_each_other(rnode, _whole_ready_pods(rnode))
        assert synchronizations(daemon) == ROUNDS + 1
        assert_nothing_left_after_removal(rnode, checker)
    finally:
        churn.stop()
        if stub is not None:
            stub.stop()


def _hold_after_the_shim(rnode: RecoveryNode) -> None:
    """containerd's own CNI list gets the block plugin after nri-cni-shim: it holds the ADD once
    the shim's ADD (nri-cni's whole attach) is done. containerd reads the list at start."""
    path = next(rnode.setup.conf_dir.glob("*.conflist"))
    conf = json.loads(path.read_text())
    conf["plugins"].append(rnode.block_plugin("ADD"))
    path.write_text(json.dumps(conf))


def _release(rnode: RecoveryNode, stub, blocked) -> None:
    if stub is None:
        rnode.block.disarm()
        rnode.block.release(blocked)  # (killed: the orphaned plugin ends into a dead pipe)
    else:
        stub.plugin.hold.clear()


def _cut(rnode: RecoveryNode, stub, blocked, fault: str) -> None:
    """containerd goes while the held call waits: kill -9 by PID, or a clean stop (SIGTERM: its
    shutdown runs while the call is held, and the call is let go during it)."""
    ctd = rnode.ctd
    if fault == "kill9":
        assert ctd.kill9() == -signal.SIGKILL
        _release(rnode, stub, blocked)
        return
    with ThreadPoolExecutor(1) as pool:
        mark = ctd.log_offset()
        stopping = pool.submit(ctd.stop)
        ctd.wait_logged("Stop CRI service", mark)  # its shutdown has begun (the first line it logs)
        _release(rnode, stub, blocked)
        stopping.result(30)


@pytest.mark.parametrize("fault", ["kill9", "stop"])
@pytest.mark.parametrize("hold", ["cni-list", "slow-nri-plugin"])
def test_containerd_goes_between_the_shims_add_and_the_end_of_run_pod_sandbox(rnode, hold, fault):
    if hold == "cni-list":
        _hold_after_the_shim(rnode)
    ctd, daemon, stub = _start(rnode, slow=hold == "slow-nri-plugin")
    survivor = rnode.run_pod("survivor", ports=False)
    checker = rnode.leak_checker().start()
    pool = ThreadPoolExecutor(1)
    try:
        for round_ in range(ROUNDS):
            name = f"cut-{round_}-{uuid.uuid4().hex[:6]}"
            blocked = None
            if stub is None:
                rnode.block.arm()
            else:
                stub.plugin.hold.set()
            held = len(stub.plugin.held) if stub is not None else 0
            creation = pool.submit(rnode.run_pod, name, ports=False)
            if stub is None:
                blocked = rnode.block.wait_blocked("ADD", None)
                assert blocked.ppid == ctd.pid  # containerd runs it, after the shim
                victim = blocked.container_id
            else:
                victim = stub.plugin.wait_for(
                    lambda n=held: len(stub.plugin.held) > n and stub.plugin.held[-1]
                )
            assert victim in pod_ids_in(daemon)  # the shim's ADD is done: nri-cni attached it
            checker.add_markers(victim)
            _cut(rnode, stub, blocked, fault)
            with pytest.raises(grpc.RpcError):
                creation.result(60)
            ctd.start()
            wait_resynchronized(daemon, round_ + 2)
            if stub is not None:
                stub.wait_synchronized(30)
            states = {p.id: p.state for p in ctd.cri.list_pods()}
            print(f"round {round_}: the cut pod is {states.get(victim, 'not listed')}")
            assert_true_within_settle(rnode)
            assert_pods_reach_each_other(rnode, _whole_ready_pods(rnode))
            assert survivor in {p.id for p in _whole_ready_pods(rnode)}
        pool.shutdown()
        assert_nothing_left_after_removal(rnode, checker)
    finally:
        if stub is not None:
            stub.plugin.hold.clear()
            stub.stop()
