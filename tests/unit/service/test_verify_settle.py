"""One pod's part of a verify round (Verifier._settle): judged without its lock when there is
nothing to run, else under it; left to the next round while an operation holds it; read again
when an operation changed its attachments since the round read it; a pod whose runtime network
is lost (secondary mode) judged without a CHECK; the CHECK run in the pod's listed netns, its
error reported. Each test states its control case: the same round with the one input changed
that flips the outcome. Without root: the plugins are the fake executor's, the node inspector a
fake (tests/support/verifyworld.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import zlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.exec_errors import Ended
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.service import verify
from nri_cni.service.modes import Mode, SecondaryMode, mode_in_force
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from tests.support import verifyworld

POD = "e7" * 32
IP = "10.79.0.2"
RARE = {"check_every": 1000}  # a cadence CHECK of eth0 falls in none of the test's rounds
UNASKABLE = {"type": "e7-br"}  # no `ips` capability: a repair would touch nothing


def World(tmp: Path, **kw: Any) -> verifyworld.World:
    return verifyworld.World(tmp, tag="e7", ip=IP, **kw)


def test_eth0s_cadence_check_falls_in_none_of_these_rounds():
    """The premise of the tests with RARE: round 1..3 CHECK nothing netlink found intact."""
    assert zlib.crc32(f"{POD}/podnet/eth0".encode()) % RARE["check_every"] not in (1, 2, 3)


def _seen(health: PodHealth) -> list[tuple[str, str, str]]:
    return [(a.network, a.ifname, a.finding) for a in health.attachments]


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("ok", [PodState.OK]),  # nothing to run: judged from the round's read, no lock
        ("damaged", []),  # control: a repair to run -> under the lock, the netns gone: no verdict
    ],
)
def test_a_pod_with_nothing_to_run_is_judged_from_the_rounds_read(tmp_path, answer, expected):
    """The pod's netns path goes while the round reads it (netlink found it as `answer`). A pod
    netlink found intact, no CHECK due, is judged from that read, without its lock: ok. Control:
    the same pod found damaged is settled under its lock, which reads its record again and finds
    the netns gone: no verdict (none recorded either)."""
    w = World(tmp_path, verify=RARE)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()

        async def netns_goes() -> None:
            Path(w.pod.netns).unlink()

        w.inspector.answers = [answer]
        w.inspector.on_inspect = netns_goes
        return await w.svc.timers.verify()

    assert [h.state for h in w.run(scenario)] == expected
    assert w.fake.commands() == ["ADD"]  # nothing CHECKed, nothing repaired
    assert (w.svc.health.get(POD) is not None) == bool(expected)


@pytest.mark.parametrize(
    "answer, busy, expected",
    [
        ("ok", True, []),  # an operation holds it: the next round's, not waited for
        ("damaged", True, []),  # the same, found damaged
        ("ok", False, [PodState.OK]),  # control: its lock free -> judged
        ("damaged", False, [PodState.REPAIRED]),  # control: its lock free -> repaired
    ],
)
def test_a_timer_round_leaves_a_pod_an_operation_took_while_it_read_to_the_next_round(
    tmp_path, answer, busy, expected
):
    """An operation takes the pod's lock while a timer round reads it (netlink found it as
    `answer`, no CHECK due): the round gives no verdict for it and does not wait for the
    operation (asks for no lock). Control: the same rounds without the operation -> the pod's
    verdict (ok; the damaged one repaired)."""
    w = World(tmp_path, verify=RARE)
    locks = w.svc.verifier.locks
    asked: list[str] = []  # the pod locks asked for once the operation holds its own
    real_pod = locks.pod

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        holding, release = asyncio.Event(), asyncio.Event()

        async def operation() -> None:
            async with real_pod(POD):
                holding.set()
                await release.wait()

        def pod_lock(pod_id: str, **kw: Any) -> AbstractAsyncContextManager[None]:
            asked.append(pod_id)
            release.set()  # a round waiting for the operation: let it end
            return real_pod(pod_id, **kw)

        tasks = []

        async def operation_starts() -> None:
            tasks.append(asyncio.create_task(operation()))
            await holding.wait()
            locks.pod = pod_lock  # type: ignore[method-assign]

        w.inspector.answers = [answer]
        if busy:
            w.inspector.on_inspect = operation_starts
        try:
            return await w.svc.timers.verify()
        finally:
            release.set()
            await asyncio.gather(*tasks)

    assert [h.state for h in w.run(scenario)] == expected
    if busy:
        assert asked == [] and w.svc.health.get(POD) is None
        assert w.fake.commands() == ["ADD"]


def _other_network(w: verifyworld.World) -> CacheEntry:
    """A second attachment of the pod, net1 on "othernet" (as another operation would add)."""
    result = {"cniVersion": "1.1.0", "ips": [{"address": "10.80.0.2/24", "interface": 0}]}
    config = json.dumps({**w.conflist, "name": "othernet"}).encode()
    return CacheEntry(POD, "net1", "othernet", config, w.pod.netns, result=result)


@pytest.mark.parametrize("added", [True, False], ids=["added-meanwhile", "control-unchanged"])
def test_a_pod_whose_attachments_changed_since_the_round_read_it_is_read_again(tmp_path, added):
    """Netlink finds eth0 damaged; while the round read it, an operation added net1 to the pod.
    Under its lock the pod is read again (netlink now finds both intact): ok, with both
    attachments, nothing repaired. Control: nothing added -> the round's read stands: eth0
    repaired (DEL, ADD)."""
    w = World(tmp_path, verify=RARE)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()

        async def net1_added() -> None:
            w.plan.cni.cache.write(_other_network(w))

        w.inspector.answers = ["damaged"]  # the round's read; any read again: intact
        if added:
            w.inspector.on_inspect = net1_added
        return await w.svc.timers.verify()

    (health,) = w.run(scenario)
    if added:
        assert health.state is PodState.OK
        assert sorted(_seen(health)) == [("othernet", "net1", "ok"), ("podnet", "eth0", "ok")]
        assert w.fake.commands() == ["ADD"]  # read again intact: no CHECK due, nothing repaired
        assert w.inspector.asked == [POD, POD, POD]  # the round's read, the one again (2 entries)
    else:
        assert health.state is PodState.REPAIRED
        assert w.fake.commands() == ["ADD", "CHECK", "DEL", "ADD"]


class GoneInspector(verifyworld.Inspector):
    """verifyworld's inspector, and "netns-gone": netlink finds the pod's netns gone."""

    async def inspect(self, exps: Sequence[Expectation]) -> list[Finding]:
        if self.answers[:1] == ["netns-gone"] and self.on_inspect is None:
            self.answers.pop(0)
            self.asked += [e.key.split("/")[0] for e in exps]
            return [Finding(e, (Difference(FindingKind.NETNS_GONE, "netns is gone: ENOENT"),)) for e in exps]
        return await super().inspect(exps)


@pytest.mark.parametrize(
    "pause, expected",
    [
        (True, (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE)),  # its pause runs: broken
        (False, None),  # control: its pause gone too -> the reaper's, no verdict
    ],
)
def test_a_pod_whose_netns_path_is_gone_is_judged_without_its_lock_or_a_check(tmp_path, pause, expected):
    """`nri-cni verify --check`: the pod's netns path is gone before the round, its pause
    process runs (the test's own process): broken netns-unreadable, from what the round read,
    its CHECK (forced) not run. Control: the same pod whose pause is gone too -> no verdict."""
    w = World(tmp_path)
    pod = dataclasses.replace(w.pod, pid=os.getpid() if pause else 0)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.svc.roster.listed([pod])
        Path(w.pod.netns).unlink()
        return await w.svc.timers.verify(check=True)

    verdicts = w.run(scenario)
    assert [(h.state, h.code) for h in verdicts] == ([expected] if expected else [])
    assert w.fake.commands() == ["ADD"] and w.inspector.asked == []


@pytest.mark.parametrize("again", ["netns-gone", "ok"], ids=["netns-gone", "control-intact"])
def test_no_check_runs_in_a_netns_the_read_under_the_lock_finds_gone(tmp_path, again):
    """`nri-cni verify --check`: netlink finds eth0 damaged; an operation adds net1 while the
    round reads, so under the lock the pod is read again, and netlink finds its netns gone: no
    CHECK runs, the pod is broken netns-unreadable (its pause runs). Control: the read again
    finds both intact -> both CHECKed (forced), ok."""
    w = World(tmp_path, inspector=GoneInspector())
    pod = dataclasses.replace(w.pod, pid=os.getpid())

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.svc.roster.listed([pod])

        async def net1_added() -> None:
            w.plan.cni.cache.write(_other_network(w))

        w.inspector.answers = ["damaged", again]  # the round's read, the one under the lock
        w.inspector.on_inspect = net1_added
        return await w.svc.timers.verify(check=True)

    (health,) = w.run(scenario)
    if again == "netns-gone":
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE)
        assert w.fake.commands() == ["ADD"]
    else:
        assert health.state is PodState.OK
        assert w.fake.commands() == ["ADD", "CHECK", "CHECK"]


@pytest.mark.parametrize("lost", [True, False], ids=["ips-lost", "control-listed-with-ips"])
def test_a_pod_whose_runtime_network_is_lost_is_torn_down_without_a_check(tmp_path, monkeypatch, lost):
    """Secondary mode, `nri-cni verify --check`: the runtime listed the pod with an IP and now
    lists it without (its own network of the pod lost): broken torn-down, its CHECK not run.
    Control: the pod still listed with its IP -> CHECKed, ok."""
    w = World(tmp_path)
    cache = ResultCache(str(tmp_path / "runtime-cache"))

    def secondary(source: Any) -> Mode:
        return SecondaryMode(mode_in_force(source).primary, cache)

    monkeypatch.setattr(verify, "mode_in_force", secondary)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        if lost:
            w.svc.roster.listed([dataclasses.replace(w.pod, ips=())])
        return await w.svc.timers.verify(check=True)

    (health,) = w.run(scenario)
    if lost:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.TORN_DOWN)
        assert w.fake.commands() == ["ADD"]
    else:
        assert health.state is PodState.OK
        assert w.fake.commands() == ["ADD", "CHECK"]


@pytest.mark.parametrize("moved", [True, False], ids=["listed-elsewhere", "control-same-path"])
def test_a_check_runs_in_the_netns_the_runtime_lists_for_the_pod(tmp_path, moved):
    """`nri-cni verify POD --check`: the runtime now lists the pod's netns at another path than
    its attachment's record has: the CHECK runs there. Control: the same path -> there."""
    w = World(tmp_path)
    listed = tmp_path / "netns-listed"
    listed.write_text("")
    netns: list[str] = []

    def check(call: Any) -> bytes:
        netns.append(call.env["CNI_NETNS"])
        return b""

    w.fake.plugins["e7-br"] = {"ADD": w._add, "CHECK": check}

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        if moved:
            w.svc.roster.listed([dataclasses.replace(w.pod, netns=str(listed))])
        return await w.svc.timers.verify(POD, check=True)

    (health,) = w.run(scenario)
    assert health.state is PodState.OK
    assert netns == [str(listed) if moved else w.pod.netns]


@pytest.mark.parametrize("fails", [True, False], ids=["check-fails", "control-check-passes"])
def test_a_failed_checks_error_is_the_attachments_verdict(tmp_path, fails):
    """`nri-cni verify --check`: eth0's CHECK fails with the plugin's error, and its chain
    cannot be asked for its IP (no repair): broken ips-not-requestable, the reason and eth0's
    verdict naming the plugin's error. Control: the CHECK passes -> ok."""
    w = World(tmp_path, plugin=UNASKABLE)
    gone = {"cniVersion": "1.1.0", "code": 11, "msg": "veth peer of eth0 gone"}
    answer = Ended(stdout=json.dumps(gone).encode(), status=1) if fails else b""
    w.fake.plugins["e7-br"] = {"ADD": w._add, "CHECK": lambda call: answer}

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.timers.verify(check=True)

    (health,) = w.run(scenario)
    if fails:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.IPS_NOT_REQUESTABLE)
        (eth0,) = health.attachments
        assert (eth0.finding, "veth peer of eth0 gone" in eth0.detail) == ("check-failed", True)
        assert f"podnet/eth0: CHECK failed: {eth0.detail}" in health.reason
    else:
        assert health.state is PodState.OK and _seen(health) == [("podnet", "eth0", "ok")]


def test_a_rounds_check_that_starts_after_the_next_round_began_still_runs(tmp_path):
    """Every other round CHECKs eth0 (check_every 2). The CHECK queued by eth0's round starts
    only after the next round began (the queue held): it runs, for the round that queued it.
    Control: the next round itself, whose cadence has no CHECK of eth0, queues none."""
    w = World(tmp_path, verify={"check_every": 2})
    slot = zlib.crc32(f"{POD}/podnet/eth0".encode()) % 2
    checker = w.svc.verifier.checker
    queue = checker.queue
    held: list[list[Any]] = []
    checker.queue = lambda jobs: held.append(list(jobs))  # type: ignore[method-assign]

    async def scenario() -> None:
        await w.attached_and_listed()
        if slot == 0:  # eth0's CHECK falls in the even rounds: round 1 first
            await w.svc.timers.verify()
            assert held == [[]]
            held.clear()
        await w.svc.timers.verify()  # eth0's round
        await w.svc.timers.verify()  # the next one
        assert [[j.check.pod.id for j in jobs] for jobs in held] == [[POD], []]
        queue(held[0])
        await checker.idle()

    w.run(scenario)
    assert w.fake.commands() == ["ADD", "CHECK"]
