"""Faults on a real CRI-O 1.36, from outside, by PID (as the containerd fault tests do): CRI-O
killed (SIGKILL) and stopped (SIGTERM) in the middle of a churn of pod creations and removals,
restarted with its pods kept, in shim mode and in secondary mode. nri-cni's own faults on CRI-O (killed in a churn,
restarted with pods attached) are in test_runtimes.py, written once for both runtimes.

Acceptance: every pod CRI-O lists READY has exactly its networks with the IPs CRI-O
reports, or nri-cni names it broken for a listed reason; `nri-cni pods` lists no pod CRI-O does
not have; once every pod is removed nothing is left: no reservation, link, bridge port,
firewall rule, cache or intent file, CRI-O libcni cache entry or netns pin.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support.containerd import CNI_RESULTS_DIR, remove_netns
from tests.support.crionode import crio_rnode, runtime_leaks, start_secondary  # noqa: F401 (fixture)
from tests.support.faultnode import (
    CHURN_FAULTS,
    ROUNDS,
    Churn,
    assert_nothing_left_after_removal,
    assert_pods_reach_each_other,
    assert_true_within_settle,
    broken_by_name,
    churn_through_runtime_faults,
    synchronizations,
)
from tests.support.recovery_node import pod_ids_in

pytestmark = pytest.mark.e2e


GRACE = 10.0  # gc.unlisted_grace of this test's daemon (seconds)


def _links_in(pin: str) -> list[str]:
    out = subprocess.run(
        ["nsenter", f"--net={pin}", "ip", "-o", "link", "show"], check=True, capture_output=True, text=True
    ).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def _release_cut_pods(node, ours: tuple[str, ...]) -> dict[str, str]:
    """Pods whose creation the fault cut, CRI-O cannot restore and drops at its restart, with
    no CNI DEL, leaving their netns pinned. nri-cni holds such a pod while its attach may still
    be in flight in the runtime (gc.unlisted_grace, from the attach); a GC after that releases
    it although its netns still exists: the runtime's list is the roster. Every resource
    nri-cni held of them is checked released (IPs, cache, intents, its interfaces `ours` in
    the still pinned netns); only then are CRI-O's own leftover pins unpinned, as CRI-O should
    have (nri-cni never removes a runtime's pin). Returns CRI-O's pods: id -> netns pin."""
    crio, daemon = node.ctd, node.daemon
    listed = {p.id: crio.cri.pod_status(p.id).netns_path for p in crio.cri.list_pods()}
    dropped = set(pod_ids_in(daemon)) - set(listed)
    orphans = set(crio.netns_pins()) - set(listed.values())
    print(f"dropped by CRI-O at its restart: {len(dropped)}; its orphan netns pins: {len(orphans)}")
    time.sleep(GRACE)  # every attach happened before the last restart: its grace is over
    assert daemon.ask("gc")["errors"] == []
    assert {p["id"] for p in daemon.pods()} == set(listed)  # `nri-cni pods`: CRI-O's pods only
    assert set(crio.netns_pins()) >= orphans  # nri-cni left CRI-O's pins alone
    assert {r.container_id for r in node.reservations()} <= set(listed)
    assert [f for f in node.cache_files() if any(pod in f for pod in dropped)] == []
    assert node.intents() == []
    for pin in orphans:
        assert set(_links_in(pin)) & set(ours) == set(), pin
        remove_netns(pin)
    return listed


def _whole_ready(node):
    broken = broken_by_name(node.daemon)
    return [p for p in node.runtime_pods() if p.id not in broken]


def test_crio_killed_and_stopped_in_the_middle_of_a_churn(crio_rnode):
    node = crio_rnode
    crio = node.start_containerd()
    cfg = node.daemon_config([node.podnet(finalize=False)], gc={"interval": 0, "unlisted_grace": GRACE})
    daemon = node.start_daemon(cfg)
    checker = node.leak_checker().start()
    churn = Churn(node).start()
    try:
        churn_through_runtime_faults(node, churn, CHURN_FAULTS)
        created = list(churn.created)
        checker.add_markers(*created)
        print(
            f"{len(created)} pods created, {len(churn.failed)} calls cut; CRI-O lists "
            f"{len(crio.cri.list_pods())}, broken: {broken_by_name(daemon)}"
        )
        # a pod whose StopPodSandbox the fault cut after its CNI DEL comes back READY without an
        # IP: named broken `torn-down` (nothing nri-cni attaches would be reported by CRI-O)
        took = assert_true_within_settle(node, allowed=("ip-taken", "torn-down"))
        print(f"node true {took:.2f} s after the last reconnect")
        assert set(churn.kept) <= {p.id for p in crio.cri.list_pods()}  # kept pods live through it
        _release_cut_pods(node, ours=("eth0",))
        assert_pods_reach_each_other(node, _whole_ready(node))
        assert synchronizations(daemon) == ROUNDS + 1
        assert_nothing_left_after_removal(node, checker)
        assert runtime_leaks(crio, created) == []
    finally:
        churn.stop()


def test_crio_stopped_and_killed_in_a_churn_secondary_mode(crio_rnode):
    """Secondary mode (CRI-O's bridge for eth0, nri-cni's macvlan net1 added at NRI RUN): CRI-O
    stopped (SIGTERM), then killed (SIGKILL), by its PID, in the middle of a churn, restarted
    with its pods kept. Every READY pod whole with both networks or named broken, `nri-cni pods`
    lists CRI-O's pods only, and nothing is left once they are removed."""
    node = crio_rnode
    daemon, crio, checker = start_secondary(node, node.fastnet(), gc={"interval": 0, "unlisted_grace": GRACE})
    churn = Churn(node).start()
    try:
        churn_through_runtime_faults(node, churn, ["stop", "kill9"])
        created = list(churn.created)
        checker.add_markers(*created)
        print(
            f"{len(created)} pods created, {len(churn.failed)} calls cut; CRI-O lists "
            f"{len(crio.cri.list_pods())}, broken: {broken_by_name(daemon)}"
        )
        # a pod whose stop (after its CNI DEL) or creation the fault cut comes back READY without
        # an IP: named broken `torn-down` (its eth0 is CRI-O's to make)
        took = assert_true_within_settle(node, interfaces=("eth0", "net1"), allowed=("ip-taken", "torn-down"))
        print(f"node true {took:.2f} s after the last reconnect")
        assert set(churn.kept) <= {p.id for p in crio.cri.list_pods()}
        listed = _release_cut_pods(node, ours=("net1",))
        assert synchronizations(daemon) == 3
        for pod in listed:
            node.remove_pod(pod)
        assert node.reservations() == [] and node.cache_files() == [] and node.intents() == []
        assert daemon.pods() == []
        # what CRI-O itself keeps (its eth0's lease and libcni cache entry) is CRI-O's leak, not
        # nri-cni's, where CRI-O ran no CNI DEL that worked: a pod whose creation the fault cut
        # (CRI-O drops it at its restart), or one whose DEL a SIGTERM cancelled (CRI-O logs the
        # failure, marks the network stopped all the same and never runs that DEL again). Every
        # leftover is put down to one of the two, then removed; any other fails the test.
        leftovers = set(_crio_leftovers(node))
        cancelled = leftovers & crio.failed_teardowns()
        print(
            f"CRI-O's own leftovers: {len(leftovers)}, of them {len(cancelled)} after a CNI DEL it logged failed"
        )
        assert not (leftovers - cancelled) & set(created)
        assert runtime_leaks(crio, created) == []
        assert checker.leaks() == []
    finally:
        churn.stop()


def _crio_leftovers(node) -> list[str]:
    """Removes CRI-O's eth0 leases (and its libcni cache entries) of pods it no longer has;
    returns their container ids."""
    gone = []
    for address, holder in node.primary.reservations().items():
        cid = holder.split()[0]
        gone.append(cid)
        (node.primary.ipam_dir / node.primary.name / address).unlink()
        for entry in CNI_RESULTS_DIR.glob(f"{node.primary.name}-{cid}-*"):
            entry.unlink()
    return gone
