"""Faults on a real CRI-O 1.36, from outside, by PID (as the containerd fault tests do): CRI-O
killed (SIGKILL) and stopped (SIGTERM) in the middle of a churn of pod creations and removals,
restarted with its pods kept (shim mode). nri-cni's own faults on CRI-O (killed in a churn,
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

from tests.e2e.crionode import crio_rnode, runtime_leaks  # noqa: F401 (fixture)
from tests.e2e.faultnode import (
    Churn,
    assert_pods_reach_each_other,
    assert_true_within_settle,
    broken_by_name,
    churn_through_runtime_faults,
    synchronizations,
)
from tests.e2e.test_faults_containerd import CHURN_FAULTS, ROUNDS, _assert_nothing_left_after_removal
from tests.e2e.test_recovery_node import pod_ids_in
from tests.support.containerd import remove_netns

pytestmark = pytest.mark.e2e


GRACE = 10.0  # gc.unlisted_grace of this test's daemon (seconds)


def _links_in(pin: str) -> list[str]:
    out = subprocess.run(
        ["nsenter", f"--net={pin}", "ip", "-o", "link", "show"], check=True, capture_output=True, text=True
    ).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


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
        # Pods whose creation the kill cut, CRI-O cannot restore and drops at its restart, with
        # no CNI DEL, leaving their netns pinned. nri-cni holds such a pod while its attach may
        # still be in flight in the runtime (gc.unlisted_grace, from the attach), and a GC after
        # that releases it although its netns still exists: the runtime's list is the roster.
        listed = {p.id: crio.cri.pod_status(p.id).netns_path for p in crio.cri.list_pods()}
        dropped = set(pod_ids_in(daemon)) - set(listed)
        orphans = set(crio.netns_pins()) - set(listed.values())
        print(f"dropped by CRI-O at its restart: {len(dropped)}; its orphan netns pins: {len(orphans)}")
        time.sleep(GRACE)  # every attach happened before the last restart: its grace is over
        assert daemon.ask("gc")["errors"] == []
        assert set(pod_ids_in(daemon)) <= set(listed)
        # every resource nri-cni held of them is released (IPs, cache, intents, their links in
        # the still pinned netns); only then are CRI-O's own leftover pins unpinned, as CRI-O
        # should have (nri-cni never removes a runtime's pin)
        assert set(crio.netns_pins()) >= orphans
        assert {r.container_id for r in node.reservations()} <= set(listed)
        assert [f for f in node.cache_files() if any(pod in f for pod in dropped)] == []
        assert node.intents() == []
        for pin in orphans:
            assert _links_in(pin) == ["lo"], pin
            remove_netns(pin)
        assert set(pod_ids_in(daemon)) <= set(listed)
        assert_pods_reach_each_other(node, _whole_ready(node))
        assert synchronizations(daemon) == ROUNDS + 1
        _assert_nothing_left_after_removal(node, checker)
        assert runtime_leaks(crio, created) == []
    finally:
        churn.stop()
