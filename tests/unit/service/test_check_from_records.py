"""The runtime's CHECK right after a pod's ADD (CRI-O's, through the shim) is answered from the
records, with no plugin call, when the pod's last operation is that ADD and netlink shows its
attachments as their results say; anything else (the node differs, no ADD recorded, another
netns or ifname, an ADD older than the bound, a later operation) runs the plugins' CHECK as
before. Without root: the plugins are the fake executor's, the node inspector a fake."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.pod.intents import Intent
from nri_cni.pod.model import PodInfo
from nri_cni.service import verbs
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan, pod_service

POD = "c6" * 32
NET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "c6-br"}]}


def _result(call) -> bytes:
    netns = call.env["CNI_NETNS"]
    return json.dumps(
        {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": netns, "mac": "02:00:00:00:c6:01"}],
            "ips": [{"address": "10.66.0.2/24", "interface": 0}],
        }
    ).encode()


class FakeInspector:
    """What NodeInspector answers: every attachment as expected, or (`differs`) its link gone.
    `hold`: its next read waits for `held` to be set, and every read meanwhile (what a real
    pool would queue behind it) finds the link gone; `reading` is set once it holds."""

    def __init__(self) -> None:
        self.differs = False
        self.asked: list[Expectation] = []
        self.hold = False
        self.reading = asyncio.Event()
        self.held = asyncio.Event()
        self.queued: list[Expectation] = []

    async def inspect(self, exps: Sequence[Expectation]) -> list[Finding]:
        if self.reading.is_set() and not self.held.is_set():
            self.queued += exps
            return [Finding(e, (Difference(FindingKind.LINK_MISSING, "queued behind a read"),)) for e in exps]
        self.asked += exps
        if self.hold:
            self.hold = False
            self.reading.set()
            await self.held.wait()
        if self.differs:
            return [Finding(e, (Difference(FindingKind.LINK_MISSING, "no eth0"),)) for e in exps]
        return [Finding(e) for e in exps]

    def close(self) -> None:
        pass


class World:
    """`inspector`: the pods' own netns pool's (the CHECK's look), `rounds`: the verify
    rounds' (`shared`: one for both, as before the pods had a pool of their own)."""

    def __init__(self, tmp: Path, net: dict = NET, *, shared: bool = False) -> None:
        self.fake = FakeExecutor({"c6-br": {"ADD": _result}})
        doc = {
            "mode": "shim",
            "state_dir": str(tmp / "state"),
            "networks": [{"name": "podnet", "default": True, "conflist": net}],
        }
        cfg = parse_config(doc, str(tmp / "config.yaml"))
        cni = CNIRuntime(["/fake-bin"], str(tmp / "cache"), executor=self.fake)
        self.inspector = FakeInspector()
        self.rounds = self.inspector if shared else FakeInspector()
        plan = pod_plan(cfg, cni)
        self.svc = pod_service(
            cfg,
            plan,
            mode=mode_for(cfg),
            inspector=self.rounds,
            pod_inspector=self.inspector,  # type: ignore[arg-type]
        )
        netns = tmp / "netns"
        netns.write_text("")  # a path that exists; what it holds is the fake inspector's answer
        self.pod = PodInfo(POD, name="c6-pod", namespace="default", netns=str(netns))

    def checks(self) -> int:
        return self.fake.commands().count("CHECK")


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")

    def read(op: str = "check") -> list[dict]:
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
        return [line for line in lines if line["op"] == op]

    return read


def test_a_check_right_after_the_add_is_answered_from_the_records(tmp_path, records):
    w = World(tmp_path)

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        await w.svc.verbs.check(w.pod, "eth0")
        await w.svc.close()

    asyncio.run(scenario())
    assert w.checks() == 0 and w.fake.commands() == ["ADD"]
    assert [e.ifname for e in w.inspector.asked] == ["eth0"]  # netlink looked at the pod
    (check,) = records()
    assert check["from"] == "records" and check["result"] == "ok" and check["plugins"] == []
    assert [(n["network"], n["ifname"], n["op"]) for n in check["networks"]] == [("podnet", "eth0", "check")]


def test_only_the_first_check_after_the_add_is_answered_from_the_records(tmp_path, records):
    w = World(tmp_path)

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        await w.svc.verbs.check(w.pod, "eth0")
        await w.svc.verbs.check(w.pod, "eth0")  # its last operation is a CHECK now, not the ADD
        await w.svc.close()

    asyncio.run(scenario())
    assert [c["from"] for c in records()] == ["records", "plugins"] and w.checks() == 1


def test_the_plugins_check_when_the_node_differs(tmp_path, records):
    w = World(tmp_path)
    w.inspector.differs = True

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        await w.svc.verbs.check(w.pod, "eth0")
        await w.svc.close()

    asyncio.run(scenario())
    assert w.checks() == 1
    (check,) = records()
    assert check["from"] == "plugins" and [p["command"] for p in check["plugins"]] == ["CHECK"]


def test_the_plugins_check_without_an_add_record(tmp_path, records):
    """A daemon restarted since the ADD (the cache has it, the operation log does not): the
    plugins' CHECK, and the node inspector is not even asked."""
    w = World(tmp_path)

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        w.svc.plan.oplog.fresh.clear()  # what a restarted daemon knows: the cache only
        await w.svc.verbs.check(w.pod, "eth0")
        await w.svc.close()

    asyncio.run(scenario())
    assert w.checks() == 1 and w.inspector.asked == []
    assert [c["from"] for c in records()] == ["plugins"]


@pytest.mark.parametrize("change", ["netns", "ifname", "old", "deleted"])
def test_the_plugins_check_when_the_check_is_not_of_that_add(tmp_path, records, change):
    """Another netns or ifname than the ADD's, an ADD older than the bound, or a DEL since
    (nothing cached: nothing to CHECK, no record)."""
    w = World(tmp_path)
    now = [1000.0]
    w.svc.plan.oplog.clock = lambda: now[0]
    pod, ifname = w.pod, "eth0"

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        if change == "deleted":
            await w.svc.verbs.detach(w.pod)
        if change == "old":  # the CHECK comes a second past the bound after the ADD's end
            now[0] += verbs.CHECK_FROM_RECORDS_WITHIN + 1
        await w.svc.verbs.check(pod, ifname)
        await w.svc.close()

    if change == "netns":
        other = tmp_path / "other-netns"
        other.write_text("")
        pod = PodInfo(POD, name="c6-pod", namespace="default", netns=str(other))
    elif change == "ifname":
        ifname = "net1"
    asyncio.run(scenario())
    assert not [c for c in records() if c.get("from") == "records"]
    assert w.inspector.asked == []
    if change == "deleted":
        assert w.checks() == 0 and records() == []
    else:
        assert w.checks() == 1


@pytest.mark.parametrize("by", ["check", "verify"], ids=["check-from-records", "control-verify-round"])
def test_the_check_from_records_reads_the_pods_side_only(tmp_path, by):
    """The look netlink takes for a CHECK answered from the records is the cheap one: the pod's
    links, addresses and routes, not what its chain made on the host (host-local's lease here).
    Control: a verify round's read of the same pod asks for the lease too."""
    leases = tmp_path / "leases"
    plugin = {"type": "c6-br", "ipam": {"type": "host-local", "dataDir": str(leases)}}
    w = World(tmp_path, {**NET, "plugins": [plugin]})

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        if by == "check":
            await w.svc.verbs.check(w.pod, "eth0")
        else:
            w.svc.roster.listed([w.pod])
            await w.svc.timers.verify()
        await w.svc.close()

    asyncio.run(scenario())
    (exp,) = w.inspector.asked if by == "check" else w.rounds.asked
    assert [lease.path for lease in exp.leases] == (
        [] if by == "check" else [str(leases / "podnet" / "10.66.0.2")]
    )
    if by == "check":
        assert w.checks() == 0  # answered from the records


@pytest.mark.parametrize("shared", [False, True], ids=["pools-apart", "control-one-pool"])
def test_a_check_is_answered_from_the_records_while_a_round_reads(tmp_path, records, shared):
    """A verify round's netlink read holds the rounds' pool (500 pods: ~0.5 s); the CHECK right
    after an ADD looks at its pod through the pods' own and is answered from the records
    meanwhile. Control: with one pool for both (as before), the CHECK's look waits behind the
    round's (the fake answers it "link gone": the plugins' CHECK runs instead)."""
    w = World(tmp_path, shared=shared)
    other = PodInfo("c7" * 32, name="c7-pod", namespace="default", netns=w.pod.netns)

    async def scenario():
        await w.svc.verbs.attach(other)
        await w.svc.verbs.attach(w.pod)
        w.svc.roster.listed([other])
        w.rounds.hold = True
        w.rounds.held.clear()
        w.rounds.reading.clear()
        round_ = asyncio.ensure_future(w.svc.timers.verify())
        await w.rounds.reading.wait()  # the round reads the node now
        await w.svc.verbs.check(w.pod, "eth0")
        w.rounds.held.set()
        await round_
        await w.svc.close()

    asyncio.run(scenario())
    froms = [c["from"] for c in records()]
    if shared:
        assert froms == ["plugins"] and w.checks() == 1
        assert [e.key.split("/")[0] for e in w.rounds.queued] == [POD]
    else:
        assert froms == ["records"] and w.checks() == 0
        assert [e.key.split("/")[0] for e in w.inspector.asked] == [POD]
        assert [e.key.split("/")[0] for e in w.rounds.asked] == [other.id]


@pytest.mark.parametrize(
    "case", ["control", "at-the-bound", "interrupted-add", "cached-without-result", "cached-in-another-netns"]
)
def test_what_the_records_must_show_besides_the_add(tmp_path, records, case):
    """The cache and the intent records have their say too. A CHECK that comes exactly at the
    bound after the ADD is still answered from the records (a second past it is not: above).
    An ADD interrupted since (its intent record), or a cached attachment without its result or
    of another netns than the pod's, is not what the ADD left: the plugins' CHECK runs.
    Control: the ADD alone."""
    w = World(tmp_path)
    now = [1000.0]
    w.svc.plan.oplog.clock = lambda: now[0]

    def edit_entry(change) -> None:
        path = Path(w.svc.plan.cni.cache.path("podnet", POD, "eth0"))
        entry = json.loads(path.read_text())
        change(entry)
        path.write_text(json.dumps(entry))

    async def scenario():
        await w.svc.verbs.attach(w.pod)
        if case == "at-the-bound":
            now[0] += verbs.CHECK_FROM_RECORDS_WITHIN
        elif case == "interrupted-add":
            w.svc.plan.intents.write(Intent(POD, w.pod.netns, []))
        elif case == "cached-without-result":
            edit_entry(lambda e: e.pop("result"))
        elif case == "cached-in-another-netns":
            edit_entry(lambda e: e.update(netns=str(tmp_path / "other-netns")))
        await w.svc.verbs.check(w.pod, "eth0")
        await w.svc.close()

    asyncio.run(scenario())
    answered = case in ("control", "at-the-bound")
    assert [c["from"] for c in records()] == (["records"] if answered else ["plugins"])
    assert w.checks() == (0 if answered else 1)
