"""What a verify round makes of what it read of a pod: a netns path gone while the pause
process runs or not, records that changed before the pod's lock was taken (the mode's reading
of the runtime's IPs made again), a pod the config refuses now, the runtime's own network lost
(secondary mode), a pod removed and listed again, a CHECK asked for by name of a pod an
operation holds. Each test states its control case: the same round with the one input
changed that flips the outcome. Without root: the plugins are the fake executor's, the node
inspector a fake."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from nri_cni.pod.select import NETWORKS_ANNOTATION
from nri_cni.service.decide import RepairOrder, Verdict
from nri_cni.service.modes import RuntimeIps, mode_for
from nri_cni.service.podcheck import read_checks
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from nri_cni.service.verify import ModeRead
from tests.support import verifyworld
from tests.support.verifyworld import Inspector

POD = "e9" * 32
IP, OTHER_IP = "10.80.0.2", "10.80.0.9"
NOT_RUNNING = 0  # NRI's pid of a pod whose pause process is unknown: not running
SECONDARY = {"mode": "secondary", "primary_network": "runtimenet"}


def World(tmp: Path, **kw: Any) -> verifyworld.World:
    settings = kw.pop("settings", {})
    if settings.get("mode") == "secondary":  # the runtime's libcni cache: the test's own
        settings = {**settings, "cni": {"runtime_cache_dir": str(tmp / "runtime-cache")}}
    return verifyworld.World(tmp, tag="e9", ip=IP, settings=settings, **kw)


def states(verdicts: list[PodHealth]) -> list[tuple[PodState, BrokenCode | None]]:
    return [(h.state, h.code) for h in verdicts]


@pytest.mark.parametrize("pid", [os.getpid(), NOT_RUNNING], ids=["pause-runs", "control-pause-gone"])
def test_a_pod_whose_netns_path_is_gone_is_broken_while_its_pause_process_runs(tmp_path, pid):
    """The runtime lists the pod; its netns path is gone. Its pause process runs (this test's
    own pid): broken netns-unreadable, each attachment's verdict saying so, nothing run.
    Control: no pause process -> no verdict (the reaper's)."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth]:
        await w.svc.verbs.attach(w.pod)
        w.svc.roster.listed([dataclasses.replace(w.pod, pid=pid)])
        os.unlink(w.pod.netns)
        return await w.svc.timers.verify()

    verdicts = w.run(scenario)
    assert w.fake.commands() == ["ADD"] and w.inspector.asked == []
    if pid == NOT_RUNNING:
        assert verdicts == [] and w.svc.health.get(POD) is None
        return
    (health,) = verdicts
    assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE)
    assert f"its netns path {w.pod.netns} is gone" in health.reason
    assert [(a.network, a.ifname, a.finding) for a in health.attachments] == [
        ("podnet", "eth0", "netns-unreadable")
    ]


@pytest.mark.parametrize("address", [OTHER_IP, IP], ids=["another-address", "control-same-address"])
def test_an_attachment_rewritten_before_the_pods_lock_is_judged_as_it_is_now(tmp_path, address):
    """The round reads eth0 damaged; while it reads, an operation rewrites eth0's cache entry
    with a result holding another address than the runtime reports. Under the pod's lock the
    round reads the pod again, and the runtime's IPs are compared with the new result: they
    differ, so eth0 is cut and ADDed again asking for the runtime's address, "repaired" naming
    the difference. Control: the rewritten result holds the runtime's address -> ok, nothing cut."""
    inspector = Inspector("damaged")  # the round's read; the read under the lock: ok
    w = World(tmp_path, inspector=inspector)

    async def rewrite() -> None:
        (entry,) = w.plan.cached(POD)
        result = {**(entry.result or {}), "ips": [{"address": f"{address}/24", "interface": 0}]}
        result["interfaces"] = [{**result["interfaces"][0], "mac": "02:00:00:00:0e:02"}]
        w.plan.cni.cache.write(dataclasses.replace(entry, result=result))

    inspector.on_inspect = rewrite

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.timers.verify()

    (health,) = w.run(scenario)
    cuts = w.fake.commands().count("DEL")
    if address == IP:
        assert health.state is PodState.OK and cuts == 0
        return
    assert health.state is PodState.REPAIRED and cuts == 1
    assert f"the runtime reports {IP}; eth0 has {OTHER_IP}" in health.reason
    (entry,) = w.plan.cached(POD)
    assert entry.result is not None and entry.result["ips"][0]["address"] == f"{IP}/24"


@pytest.mark.parametrize("relisted", [True, False], ids=["ips-lost-meanwhile", "control-list-unchanged"])
def test_a_pod_list_that_came_while_the_round_waited_for_the_lock_is_the_one_judged(tmp_path, relisted):
    """Secondary mode, `nri-cni verify POD` of a pod the runtime lists without IPs, net1 found
    damaged; an operation holds the pod's lock. While the round waits for it, the runtime's
    list has the pod with an IP, then without: its own network is gone. Under the lock that
    list is the one judged: broken torn-down, nothing cut. Control: no list meanwhile -> net1
    DELed and ADDed again, repaired."""
    inspector = Inspector("damaged")
    w = World(tmp_path, inspector=inspector, settings=SECONDARY)
    no_ip = dataclasses.replace(w.pod, ips=())
    holding, release = asyncio.Event(), asyncio.Event()

    async def operation() -> None:
        async with w.svc.locks.pod(POD):
            holding.set()
            await release.wait()  # set while the round reads: it then waits for this lock
            if relisted:
                w.svc.roster.listed([w.pod])
                w.svc.roster.listed([no_ip])

    async def let_go() -> None:
        release.set()

    inspector.on_inspect = let_go

    async def scenario() -> list[PodHealth]:
        await w.svc.verbs.attach(no_ip)
        w.svc.roster.listed([no_ip])
        op = asyncio.create_task(operation())
        await holding.wait()
        try:
            return await w.svc.timers.verify(POD)
        finally:
            await op

    (health,) = w.run(scenario)
    if relisted:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.TORN_DOWN)
        assert "its own network of the pod is gone" in health.reason
        assert "DEL" not in w.fake.commands()
    else:
        assert health.state is PodState.REPAIRED
        assert w.fake.commands()[-2:] == ["DEL", "ADD"]


@pytest.mark.parametrize("ips_before", [True, False], ids=["listed-with-ips-before", "control-never-ips"])
def test_a_secondary_pod_the_runtime_lists_without_its_ips_is_torn_down(tmp_path, ips_before):
    """Secondary mode: net1 intact, and the runtime, which listed the pod with an IP, now lists
    it without: its own network of the pod is gone, broken torn-down (nri-cni's networks kept).
    Control: a pod the runtime never listed with an IP -> ok."""
    w = World(tmp_path, settings=SECONDARY)
    no_ip = dataclasses.replace(w.pod, ips=())

    async def scenario() -> list[PodHealth]:
        await w.svc.verbs.attach(no_ip)
        if ips_before:
            w.svc.roster.listed([w.pod])
        w.svc.roster.listed([no_ip])
        return await w.svc.timers.verify()

    verdicts = w.run(scenario)
    if ips_before:
        assert states(verdicts) == [(PodState.BROKEN, BrokenCode.TORN_DOWN)]
    else:
        assert states(verdicts) == [(PodState.OK, None)]
    assert w.fake.commands() == ["ADD"] and len(w.plan.cached(POD)) == 1


@pytest.mark.parametrize("asks", ["nosuchnet", "extranet"], ids=["refused-now", "control-accepted"])
def test_a_pod_the_config_refuses_now_has_what_it_has_verified_and_nothing_added(tmp_path, asks):
    """The runtime lists the pod with an annotation asking for a network the config does not
    have (refused now, as after a reload): its eth0 is read, ok, and nothing is ADDed. Control:
    the annotation asks for a network the config has -> the pod lacks it, and the round ADDs it."""
    podnet = {
        "cniVersion": "1.1.0",
        "name": "podnet",
        "plugins": [{"type": "e9-br", "capabilities": {"ips": True}}],
    }
    extranet = {**podnet, "name": "extranet"}
    networks = [
        {"name": "podnet", "default": True, "conflist": podnet},
        {"name": "extranet", "conflist": extranet, "namespaces": ["default"]},
    ]
    w = World(tmp_path, settings={"networks": networks})

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.svc.roster.listed([dataclasses.replace(w.pod, annotations={NETWORKS_ANNOTATION: asks})])
        return await w.svc.timers.verify()

    (health,) = w.run(scenario)
    adds = w.fake.commands().count("ADD")
    if asks == "nosuchnet":
        assert health.state is PodState.OK and adds == 1
        assert [(a.network, a.ifname, a.finding) for a in health.attachments] == [("podnet", "eth0", "ok")]
    else:
        assert health.state is PodState.REPAIRED and adds == 2
        assert "extranet/net1: not attached" in health.reason


@pytest.mark.parametrize("removed", [True, False], ids=["removed-and-listed-again", "control-not-removed"])
def test_a_pod_removed_and_listed_again_starts_without_the_backoff_of_its_failed_repairs(tmp_path, removed):
    """eth0 found damaged, its repair fails (netlink finds it damaged after): the next try waits
    1 s. The pod is removed (NRI RemovePodSandbox: DEL), and the runtime lists it again with
    the same id: a round before that second is over ADDs it at once, a new pod. Control: not
    removed, its attachment gone all the same -> the round backs off, no ADD."""
    now = [100.0]
    w = World(tmp_path, inspector=Inspector("damaged", "damaged"))
    w.svc.verifier.clock = lambda: now[0]

    async def scenario() -> int:
        await w.attached_and_listed()
        await w.svc.timers.verify()  # the repair fails
        assert w.svc.health.get(POD) is None
        if removed:
            await w.svc.verbs.remove(w.pod)
            w.svc.roster.listed([w.pod])
        else:
            w.plan.cni.cache.delete("podnet", POD, "eth0")
        now[0] += 0.5
        before = w.adds()
        await w.svc.timers.verify()
        return w.adds() - before

    assert w.run(scenario) == (1 if removed else 0)


@pytest.mark.parametrize("pod_id", [POD, None], ids=["by-name", "control-every-pod"])
def test_a_check_asked_for_by_name_waits_for_the_operation_that_holds_the_pod(tmp_path, pod_id):
    """`nri-cni verify --check POD` while an operation holds the pod's lock: the round waits for
    it, then CHECKs the pod (netlink found it intact) and answers its verdict. Control:
    `nri-cni verify --check` over every pod at that moment leaves the busy pod out: no CHECK,
    no verdict."""
    w = World(tmp_path)
    holding = asyncio.Event()
    verifying: list[asyncio.Task[list[PodHealth]]] = []

    async def operation() -> None:
        async with w.svc.locks.pod(POD):
            holding.set()
            # held until the round waits for this lock too (two operations on it), or is done
            while w.svc.locks.operations_in_flight() < 2 and not (verifying and verifying[0].done()):
                await asyncio.sleep(0)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        op = asyncio.create_task(operation())
        await holding.wait()
        verifying.append(asyncio.create_task(w.svc.timers.verify(pod_id, check=True)))
        try:
            return await verifying[0]
        finally:
            await op

    verdicts = w.run(scenario)
    checks = w.fake.commands().count("CHECK")
    if pod_id is None:
        assert verdicts == [] and checks == 0
    else:
        assert states(verdicts) == [(PodState.OK, None)] and checks == 1


@pytest.mark.parametrize("same_mode", [False, True], ids=["another-mode-in-force", "control-same-mode"])
def test_a_reading_of_the_runtimes_ips_is_reused_only_under_the_mode_that_made_it(tmp_path, same_mode):
    """Secondary mode: the runtime listed the pod with an IP, then without (its own network is
    gone: the mode in force reads it lost). A reading of the same check and record that found
    nothing lost, made before by a mode no longer in force (a round started since, after a
    reload), is not reused: the pod is judged torn down. Control: the same reading made by the
    mode in force is reused as it is (ok: what `_settle` saves by not asking twice)."""
    w = World(tmp_path, settings=SECONDARY)
    no_ip = dataclasses.replace(w.pod, ips=())

    async def scenario() -> Verdict | RepairOrder:
        await w.svc.verbs.attach(no_ip)
        w.svc.roster.listed([w.pod])
        w.svc.roster.listed([no_ip])
        verifier = w.svc.verifier
        (c,) = await read_checks(w.inspector, [verifier._plan(no_ip, w.plan.cached(POD))])
        record = verifier._record(POD)
        maker = verifier.mode if same_mode else mode_for(w.svc.source.current)
        return verifier._decide(c, ModeRead(c, record, maker, RuntimeIps(primary=None)), explicit=False)

    decision = w.run(scenario)
    assert isinstance(decision, Verdict)
    if same_mode:
        assert decision.state is PodState.OK
    else:
        assert (decision.state, decision.code) == (PodState.BROKEN, BrokenCode.TORN_DOWN)
