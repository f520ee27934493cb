"""Acceptance 3: containerd is restarted in the middle of a 50-pod churn (8 at a time, through the
shim). nri-cni reconnects and resynchronizes; at the end the node holds exactly the attachments
of the pods containerd has, and after they are removed, nothing at all.

Pods created before the restart get no NRI stop/remove from the new containerd (containerd#8426);
in shim mode their CNI DEL still comes through the shim, which is what detaches them. Pod
creations cut by the restart fail on the client's side (it retries under a new name, as kubelet
would); what they attached is DELed by containerd when it gives up on them, or kept while
containerd lists the pod (NOTREADY), or garbage for the GC after the reconnect.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.test_recovery_node import pod_ids_in, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

PODS = 50
PARALLEL = 8


def test_containerd_restart_in_the_middle_of_a_churn(rnode):
    ctd = rnode.start_containerd()
    cfg = rnode.daemon_config([rnode.podnet(finalize=False)])
    daemon = rnode.start_daemon(cfg)
    checker = rnode.leak_checker().start()
    restarted = threading.Event()
    done: list[str] = []
    kept: list[str] = []
    retries: list[str] = []

    def churn(i: int) -> None:
        # every third pod is kept; the others are created and removed; a call that meets the
        # restart is retried (what kubelet does)
        name = f"churn-{i}-{uuid.uuid4().hex[:6]}"
        for _attempt in range(40):
            try:
                pod = rnode.run_pod(name, ports=i % 2 == 0)
                break
            except Exception as exc:
                retries.append(f"run: {exc}")
                name = f"churn-{i}-{uuid.uuid4().hex[:6]}"
                time.sleep(0.25)
        else:
            raise AssertionError(f"pod {i} never started")
        checker.add_markers(pod)
        if i % 3 == 0:
            kept.append(pod)
            done.append(pod)
            return
        for _attempt in range(40):
            try:
                rnode.remove_pod(pod)
                break
            except Exception as exc:
                retries.append(f"remove: {exc}")
                time.sleep(0.25)
        else:
            raise AssertionError(f"pod {pod} could not be removed")
        done.append(pod)

    def restart_midway() -> None:
        while len(done) < PODS // 2:
            time.sleep(0.01)
        ctd.restart()
        restarted.set()

    with ThreadPoolExecutor(PARALLEL + 1) as pool:
        restarter = pool.submit(restart_midway)
        list(pool.map(churn, range(PODS)))
        restarter.result()
    assert restarted.is_set()

    # nri-cni reconnected on its own: registered and synchronized with the new containerd
    deadline = time.monotonic() + 20
    while not daemon.status()["nri"]["synchronized"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.log_path.read_text().count("synchronized: the runtime has") == 2
    report = daemon.ask("gc")
    assert report["errors"] == []

    listed = ctd.cri.list_pods()
    existing = {p.id for p in listed}
    ready = {p.id for p in listed if p.ready}
    attached = pod_ids_in(daemon)
    print(
        f"restart hit {len(retries)} call(s); containerd lists {len(existing)} pod(s), "
        f"{len(ready)} ready; gc deleted {len(report['deleted'])}, rolled back "
        f"{len(report['rolledBack'])}"
    )
    assert set(kept) <= ready  # (a creation the restart cut may have finished unseen)
    # exactly the attachments of the pods that exist: every running pod whole, nothing else
    assert set(attached) <= existing, set(attached) - existing
    # A creation the restart cut can leave a sandbox that the new containerd lists as ready
    # although the old one tore its network down while shutting down: nri-cni got the
    # runtime's DEL for it (an op "del": NRI stop or the shim's DEL), and obeyed. Shim mode
    # never attaches a pod behind the runtime's back (docs/reliability.md, section 4).
    # Or the old containerd removed its netns on the way down without a DEL reaching nri-cni:
    # then GC collected what was left (there is no namespace to keep an interface in).
    torn_down = {op["podId"] for op in daemon.op_lines() if op["op"] == "del"}
    unattached = ready - set(attached)
    no_netns = {
        pod for pod in unattached if not os.path.exists(ctd.cri.pod_status(pod).netns_path or "/nonexistent")
    }
    print(f"unattached ready pods: {len(unattached)}, of which without a netns: {len(no_netns)}")
    assert unattached <= torn_down | no_netns, [
        (pod, [(op["op"], op["result"]) for op in daemon.op_lines() if op["podId"] == pod])
        for pod in unattached - torn_down - no_netns
    ]
    print(f"ready pods whose network containerd itself tore down: {len(unattached)}")
    assert all(ifs == ["eth0"] for ifs in attached.values())
    assert {r.container_id for r in rnode.reservations()} == set(attached)
    assert rnode.intents() == []

    for pod in existing:
        rnode.remove_pod(pod)
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert rnode.intents() == []
    assert rnode.bridge_ports() == []
    assert checker.leaks() == []
