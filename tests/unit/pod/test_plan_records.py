"""The pod plan's own decisions around its parts: the name the runtime gives the primary's
interface (the shim's CNI_IFNAME) replaces eth0 on the primary alone; which operations leave a
record (their op log line): a refused pod, a failed ADD, CHECK or DEL do, with their error; a pod
attached already, or with nothing to check, does not; what it hands its parts (the lock set GC
takes its turn on, `running`, the readiness and lifecycle, the runtime's primary). In-process
plugins (FakeExecutor); no root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re

import pytest

from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import AnnotationRefused, NriCniError, PodError
from nri_cni.node import NodeInspector
from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.intents import Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import AttachRequest, PodInfo, PrimaryNetwork, RuntimePrimary
from nri_cni.pod.oprecord import NoSink
from nri_cni.pod.plan import PodPlan
from nri_cni.pod.select import NETWORKS_ANNOTATION
from tests.support.pods import pod_plan

POD = "d4" * 32
NETS = [
    {
        "name": "podnet",
        "default": True,
        "conflist": {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "d4-br"}]},
    },
    {
        "name": "fastnet",
        "namespaces": ["default"],
        "conflist": {"cniVersion": "1.1.0", "name": "fastnet", "plugins": [{"type": "d4-mv"}]},
    },
]
FAILS = Ended(stdout=json.dumps({"cniVersion": "1.1.0", "code": 11, "msg": "d4 says no"}).encode(), status=1)
FAST_WITH_IPS = json.dumps([{"name": "fastnet", "ips": ["10.94.0.9/24"]}])


def _add(call) -> bytes:
    return json.dumps({"cniVersion": "1.1.0", "ips": [{"address": "10.94.1.2/24"}]}).encode()


class World:
    def __init__(self, tmp_path, *, add: object = _add, check: object = b"") -> None:
        self.fake = FakeExecutor({"d4-br": {"ADD": add, "CHECK": check, "DEL": b""}, "d4-mv": {"ADD": _add}})
        doc = {"mode": "shim", "state_dir": str(tmp_path / "state"), "networks": NETS}
        self.cfg = parse_config(doc, str(tmp_path / "config.yaml"))
        self.plan = pod_plan(self.cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=self.fake))
        tmp_path.mkdir(parents=True, exist_ok=True)
        netns = tmp_path / "netns"
        netns.write_text("")
        self.pod = PodInfo(POD, name="d4-pod", namespace="default", netns=str(netns))


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")

    def read() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]

    return read


@pytest.mark.parametrize(
    ("ifname", "ours", "expected"),
    [
        ("eth7", True, [("podnet", "eth7", {}), ("fastnet", "net1", {"ips": ["10.94.0.9/24"]})]),
        ("", True, [("podnet", "eth0", {}), ("fastnet", "net1", {"ips": ["10.94.0.9/24"]})]),  # control
        ("eth7", False, [("fastnet", "net1", {"ips": ["10.94.0.9/24"]})]),  # control: the runtime's primary
    ],
    ids=["runtime-names-it", "control-no-name", "control-not-ours"],
)
def test_the_runtime_names_the_primary_interface_and_no_other(tmp_path, ifname, ours, expected):
    """The shim's CNI_IFNAME is the primary's interface; the requested network keeps its own
    name and what it asked for. Controls: no name given (eth0), and a primary that is the
    runtime's own network (secondary mode: nothing of nri-cni's is renamed)."""
    w = World(tmp_path)
    pod = PodInfo(
        POD,
        name="d4-pod",
        namespace="default",
        netns=w.pod.netns,
        annotations={NETWORKS_ANNOTATION: FAST_WITH_IPS},
    )
    selected = w.plan.select(pod, PrimaryNetwork("podnet", ours=ours), AttachRequest(primary_ifname=ifname))
    assert [(s.network.name, s.ifname, s.capability_args) for s in selected] == expected


@pytest.mark.parametrize("refusal", ["annotation", "host-network"])
def test_a_refused_pod_is_an_add_with_its_error(tmp_path, records, refusal):
    """A pod the config refuses (a network it may not ask for; no netns) is recorded as a failed
    add, with the reason, and the caller gets the refusal itself."""
    w = World(tmp_path)
    if refusal == "annotation":
        pod = PodInfo(
            POD,
            name="d4-pod",
            namespace="other",
            netns=w.pod.netns,
            annotations={NETWORKS_ANNOTATION: "fastnet"},
        )
        raised, reason = AnnotationRefused, "not allowed for pods in namespace 'other'"
    else:
        pod = PodInfo(POD, name="d4-pod", namespace="default", netns="")
        raised, reason = PodError, "pod default/d4-pod has no network namespace (host network?)"
    with pytest.raises(raised, match=re.escape(reason)):
        w.plan.select(pod, PrimaryNetwork("", ours=True), AttachRequest())
    (line,) = records()
    assert (line["op"], line["pod"], line["podId"], line["result"]) == ("add", pod.label(), POD, "error")
    assert reason in line["error"]


def test_a_failed_add_is_recorded_with_its_error_and_a_repeated_one_not_at_all(tmp_path, records):
    """Control: the pod's ADD is recorded once, ok; its second attach finds it attached (no
    record). A failed ADD is recorded with the plugin's error."""
    ok, bad = World(tmp_path / "ok"), World(tmp_path / "bad", add=FAILS)
    pod_ok = ok.plan.select(ok.pod, PrimaryNetwork("", ours=True), AttachRequest())

    async def scenario():
        await ok.plan.attach(ok.pod, pod_ok, AttachRequest())
        await ok.plan.attach(ok.pod, pod_ok, AttachRequest())  # attached already
        with pytest.raises(NriCniError, match="d4 says no"):
            await bad.plan.attach(
                bad.pod,
                bad.plan.select(bad.pod, PrimaryNetwork("", ours=True), AttachRequest()),
                AttachRequest(),
            )

    asyncio.run(scenario())
    first, failed = records()
    assert (first["op"], first["result"]) == ("add", "ok")
    assert (failed["op"], failed["result"]) == ("add", "error") and "d4 says no" in failed["error"]


def test_a_failed_check_is_recorded_with_its_error(tmp_path, records):
    """Control: a CHECK that passes is recorded ok; one of a pod with nothing attached is not
    recorded."""
    ok, bad = World(tmp_path / "ok"), World(tmp_path / "bad", check=FAILS)

    async def scenario():
        for w in (ok, bad):
            await w.plan.attach(
                w.pod, w.plan.select(w.pod, PrimaryNetwork("", ours=True), AttachRequest()), AttachRequest()
            )
        await ok.plan.check(ok.pod)
        with pytest.raises(NriCniError, match="d4 says no"):
            await bad.plan.check(bad.pod)
        await ok.plan.check(PodInfo("d5" * 32, name="d5-pod", namespace="default", netns=ok.pod.netns))

    asyncio.run(scenario())
    checks = [line for line in records() if line["op"] == "check"]
    assert [(c["podId"], c["result"]) for c in checks] == [(POD, "ok"), (POD, "error")]
    assert "d4 says no" in checks[1]["error"]


class TurnCounting(PodLocks):
    """The service's lock set, counting the GC turns taken on it."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0

    @contextlib.asynccontextmanager
    async def gc_turn(self):
        self.turns += 1
        async with super().gc_turn():
            yield


@pytest.mark.parametrize("told_running", [True, False], ids=["running", "control-not-told"])
def test_gc_through_the_plan(tmp_path, told_running):
    """GC takes its turn on the lock set it is given, DELs the pod the valid list leaves out and
    keeps the others; a valid pod whose netns path is gone is kept while `running` says it runs.
    Control: not told it runs, that pod goes too."""
    w = World(tmp_path)
    pods = {}
    for tag in ("kept", "stale", "moved"):
        netns = tmp_path / f"netns-{tag}"
        netns.write_text("")
        pods[tag] = PodInfo(tag[0] * 64, name=tag, namespace="default", netns=str(netns))
    locks = TurnCounting()

    async def scenario():
        for pod in pods.values():
            await w.plan.attach(
                pod, w.plan.select(pod, PrimaryNetwork("", ours=True), AttachRequest()), AttachRequest()
            )
        os.unlink(pods["moved"].netns)  # its netns path is gone; the runtime still lists the pod
        valid = {pods["kept"].id, pods["moved"].id}
        if told_running:
            return await w.plan.collect_garbage(
                valid, locks, running=lambda pod_id: pod_id == pods["moved"].id
            )
        return await w.plan.collect_garbage(valid, locks)

    report = asyncio.run(scenario())
    gone = {"stale"} if told_running else {"stale", "moved"}
    assert {e.container_id for e in w.plan.cached()} == {pods[t].id for t in pods} - {
        pods[t].id for t in gone
    }
    assert sorted(report["deleted"]) == sorted(f"podnet/{pods[t].id}/eth0" for t in gone)
    assert locks.turns == 1


def test_reap_and_recovery_through_the_plan(tmp_path, records):
    """Reap detaches a pod whose netns is gone (control: one whose netns is there stays); the
    recovery of an interrupted ADD is an operation of that pod's, recorded."""
    w = World(tmp_path)
    there = PodInfo("e5" * 32, name="there", namespace="default", netns=w.pod.netns)

    async def scenario():
        for pod in (w.pod, there):
            await w.plan.attach(
                pod, w.plan.select(pod, PrimaryNetwork("", ours=True), AttachRequest()), AttachRequest()
            )
        gone = tmp_path / "netns-gone"
        gone.write_text("")
        moved = PodInfo("e6" * 32, name="moved", namespace="default", netns=str(gone))
        await w.plan.attach(
            moved, w.plan.select(moved, PrimaryNetwork("", ours=True), AttachRequest()), AttachRequest()
        )
        os.unlink(gone)
        reaped = (await w.plan.reap(moved.id), await w.plan.reap(there.id))
        await w.plan.recover(Intent("e7" * 32, w.pod.netns, []))
        return moved, reaped

    moved, reaped = asyncio.run(scenario())
    assert reaped == (True, False)
    assert {e.container_id for e in w.plan.cached()} == {POD, there.id}
    assert [(r["op"], r["podId"]) for r in records() if r["op"] in ("reap", "recover")] == [
        ("reap", moved.id),
        ("recover", "e7" * 32),
    ]


def test_a_failed_del_names_every_network_it_left(tmp_path, records):
    """Two networks whose DEL fails: the error names both, one after the other, and the del is
    recorded with the error. Control: the same pod's DEL that succeeds is recorded ok."""
    bad = World(tmp_path / "bad")
    bad.fake.plugins["d4-br"]["DEL"] = FAILS
    bad.fake.plugins["d4-mv"]["DEL"] = FAILS
    ok = World(tmp_path / "ok")
    worlds = [
        (
            w,
            PodInfo(
                POD,
                name="d4-pod",
                namespace="default",
                netns=w.pod.netns,
                annotations={NETWORKS_ANNOTATION: "fastnet"},
            ),
        )
        for w in (ok, bad)
    ]

    async def scenario():
        for w, pod in worlds:
            await w.plan.attach(
                pod, w.plan.select(pod, PrimaryNetwork("", ours=True), AttachRequest()), AttachRequest()
            )
        await ok.plan.detach(worlds[0][1])
        with pytest.raises(PodError) as caught:
            await bad.plan.detach(worlds[1][1])
        return str(caught.value)

    message = asyncio.run(scenario())
    assert "DEL failed for 2 network(s): network 'fastnet': " in message  # the last attached first
    assert "d4 says no (CNI code 11); network 'podnet': " in message
    dels = [(r["result"], r.get("error", "")) for r in records() if r["op"] == "del"]
    assert [r for r, _ in dels] == ["ok", "error"] and "d4 says no" in dels[1][1]


class Gates:
    """The daemon's readiness (status.refuse_when_not_ready) and lifecycle (INIT/DEINIT) as a
    plan sees them: STATUS's error per network, the leases taken, the pokes after a DEL."""

    def __init__(self, not_ready: str) -> None:
        self.not_ready = not_ready
        self.leased: list[str] = []
        self.pokes = 0

    async def ready(self, network: str) -> str:
        return self.not_ready

    @contextlib.asynccontextmanager
    async def leases(self, nets):
        self.leased += [n.name for n in nets]
        yield

    def poke(self, network: str | None = None) -> None:
        self.pokes += 1


@pytest.mark.parametrize("not_ready", ["", "the d4 bridge is down"], ids=["control-ready", "not-ready"])
def test_the_plan_hands_its_readiness_and_lifecycle_to_its_parts(tmp_path, not_ready):
    """An ADD asks the readiness first (a network not ready refuses the pod) and holds a lease
    on a network whose plugins take part in INIT/DEINIT; a DEL pokes the lifecycle.
    Control: a ready network is attached, under its lease."""
    managed = {
        "cniVersion": "1.1.0",
        "name": "podnet",
        "plugins": [{"type": "d4-br", "cni.dev/lifecycle": ["init", "deinit"]}],
    }
    doc = {
        "mode": "shim",
        "state_dir": str(tmp_path / "state"),
        "status": {"refuse_when_not_ready": True},
        "networks": [{"name": "podnet", "default": True, "conflist": managed}],
    }
    cfg = parse_config(doc, str(tmp_path / "config.yaml"))
    fake = FakeExecutor({"d4-br": {"ADD": _add, "DEL": b""}})
    gates = Gates(not_ready)
    inspector = NodeInspector.with_workers(1)
    plan = PodPlan(
        cfg,
        CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake),
        intents=IntentStore(cfg.state_dir),
        finalized=FinalizedMarks(cfg.state_dir),
        sink=NoSink(),
        inspector=inspector,
        readiness=gates,
        lifecycle=gates,  # type: ignore[arg-type]
    )
    netns = tmp_path / "netns"
    netns.write_text("")
    pod = PodInfo(POD, name="d4-pod", namespace="default", netns=str(netns))

    async def scenario():
        selected = plan.select(pod, PrimaryNetwork("", ours=True), AttachRequest())
        if not_ready:
            with pytest.raises(NriCniError, match="the d4 bridge is down"):
                await plan.attach(pod, selected, AttachRequest())
            return
        await plan.attach(pod, selected, AttachRequest())
        await plan.detach(pod)

    try:
        asyncio.run(scenario())
    finally:
        inspector.close()
    if not_ready:
        assert fake.commands() == [] and gates.leased == ["podnet"]
    else:
        assert fake.commands() == ["ADD", "DEL"] and gates.leased == ["podnet"] and gates.pokes == 1


@pytest.mark.parametrize("given", [True, False], ids=["given", "control-none"])
def test_an_attach_hands_on_the_runtime_primary_it_was_given(tmp_path, given):
    """Secondary mode's runtime primary (whose FINALIZE the attach runs) reaches the attacher.
    Control: none given, none passed."""
    w = World(tmp_path)
    seen: list[object] = []

    class Attacher:
        async def attach(self, pod, selected, request, record, runtime_primary):
            seen.append(runtime_primary)

    w.plan.attacher = Attacher()  # type: ignore[assignment]
    primary = RuntimePrimary("runtime-net", w.plan.cni.cache) if given else None
    asyncio.run(w.plan.attach(w.pod, [], AttachRequest(), primary))
    assert seen == [primary]
