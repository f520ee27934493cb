"""Acceptance 4, doomed delete, shim mode through containerd 2.1.9. The primary network's chain is
bridge, portmap, then the scriptable `ctl` plugin, whose DEL always fails here.

When ctl's ADD fails with an error that means "nothing was created" (CNI codes 1, 2, 3, 4, 6, 7,
or the binary is not there at all), nri-cni records it as doomed: the rollback still runs ctl's
DEL but ignores its failure and goes on to portmap's and bridge's DEL, so the failed pod leaves
nothing and its removal is not blocked. Any other failure code (11 here) makes ctl's DEL failure
a real one: the rollback stops there (bridge's address stays held), the pod's error says so,
the intent record keeps what is left to undo, and every GC retries it (reporting the failure)
until the DEL succeeds.
"""

from __future__ import annotations

import uuid

import grpc
import pytest

from tests.support.recovery_node import rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def _start(rnode, *, missing=False):
    rnode.start_containerd()
    extra = [{"type": "nct-not-installed"}] if missing else [rnode.ctl_plugin()]
    cfg = rnode.daemon_config([rnode.podnet(extra_plugins=extra, finalize=False)])
    return rnode.start_daemon(cfg)


def _failed_pod(rnode, daemon) -> str:
    ids = {op["podId"] for op in daemon.op_lines() if op["op"] == "add" and op["result"] == "error"}
    assert len(ids) == 1, daemon.op_lines()
    return ids.pop()


@pytest.mark.parametrize("cause", ["code-7", "code-1", "code-4", "not-installed"])
def test_doomed_plugin_whose_del_always_fails_does_not_block_the_pod(rnode, cause):
    daemon = _start(rnode, missing=cause == "not-installed")
    checker = rnode.leak_checker().start()
    if cause != "not-installed":
        rnode.ctl("add-code", cause.split("-")[1])
    rnode.ctl("del-fail", "1")

    with pytest.raises(grpc.RpcError) as err:
        rnode.run_pod(f"doomed-{uuid.uuid4().hex[:6]}")
    msg = str(err.value)
    if cause == "not-installed":
        assert "nct-not-installed" in msg and "failed to find plugin" in msg, msg
    else:
        assert "ctl: ADD refused as told" in msg and f"CNI code {cause[5:]}" in msg, msg
        assert "undoing it failed" not in msg
    pod = _failed_pod(rnode, daemon)
    checker.add_markers(pod)
    if cause != "not-installed":
        # ctl's DEL did run (and fail) for this pod, and bridge's DEL ran after it
        assert ["DEL", pod] in [c[:2] for c in rnode.ctl_calls()]
    assert rnode.reservations() == []
    assert rnode.bridge_ports() == []
    assert rnode.intents() == []
    assert rnode.cache_files() == []
    assert pod not in {p.id for p in rnode.ctd.cri.list_pods()}
    assert checker.leaks() == []
    # nothing left to retry: a GC has no DEL to do (a missing binary still fails the GC verb)
    report = daemon.ask("gc")
    assert report["deleted"] == [] and report["rolledBack"] == []
    if cause == "not-installed":
        assert [e[:11] for e in report["errors"]] == ["GC podnet: "], report
    else:
        assert report["errors"] == []


def test_any_other_del_failure_is_reported_and_retried_by_gc(rnode):
    daemon = _start(rnode)
    checker = rnode.leak_checker().start()
    rnode.ctl("add-code", "11")  # "try again later": it may have created something
    rnode.ctl("del-fail", "1")

    with pytest.raises(grpc.RpcError) as err:
        rnode.run_pod(f"notdoomed-{uuid.uuid4().hex[:6]}")
    assert "undoing it failed too, retried later" in str(err.value), str(err.value)
    pod = _failed_pod(rnode, daemon)
    checker.add_markers(pod)
    checker.learn()
    # the rollback stopped at ctl's DEL: bridge still holds the address, the record says so
    assert [r.container_id for r in rnode.reservations()] == [pod]
    assert rnode.intents() == [pod]
    assert daemon.status()["pendingRollback"] == [pod]

    report = daemon.ask("gc")  # retried, still failing: reported
    assert report["rolledBack"] == []
    assert any(pod in e and "ctl: DEL fails as told" in e for e in report["errors"]), report
    assert rnode.intents() == [pod]

    rnode.ctl("del-fail", None)
    report = daemon.ask("gc")
    assert report == {"deleted": [], "rolledBack": [pod], "errors": []}
    assert rnode.reservations() == []
    assert rnode.intents() == []
    assert rnode.bridge_ports() == []
    assert daemon.status()["pendingRollback"] == []
    assert checker.leaks() == []
