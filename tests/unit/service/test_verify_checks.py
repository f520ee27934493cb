"""A verify round's cadence CHECKs of pods netlink found intact (nri_cni/service/checker.py): the
round returns with every pod's verdict from netlink and the host side and queues them; they run
after it, a few at once (verify.check_parallel()), each under its pod's lock at GC's nice value,
and a failed one is repaired as a round repairs. Asked for by hand (`--check`, one pod) they run
in the round. A round while CHECKs of an earlier one are queued does not wait for them; a pod
stopped, removed or collected before its CHECK starts is not CHECKed; `nri-cni status` says
when a round's CHECKs were done. Without root: a fake node inspector, the CHECK a fake."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.node import VerifyPolicy
from nri_cni.pod.model import PodInfo
from nri_cni.pod.upkeep import GC_PLUGIN_NICE
from nri_cni.service.verify import check_parallel
from tests.support.unstarted import NET, RESULT, FakeInspector, daemon_for, verify_pod

CONFIG = json.dumps(NET).encode()  # the network's conflist, as the cache entry keeps it


class Node:
    """`count` intact pods (a netns path each) listed by the runtime, every attachment's CHECK
    due each round. The CHECK (plan.check_entry) waits for `gate` while `hold`, and fails with
    `errors[pod id]`; repairs (plan.repair) are only noted."""

    def __init__(self, tmp: Path, count: int, check_every: int = 1) -> None:
        self.daemon = daemon_for(tmp, verify={"check_every": check_every})
        self.svc = self.daemon.pods
        self.pods = []
        for n in range(1, count + 1):
            netns = tmp / f"netns-{n}"
            netns.write_text("")  # a path that exists: the fake inspector answers for it
            pod = verify_pod(n, netns)
            result = {**RESULT, "ips": [{"address": f"10.9.0.{n}/24", "interface": 0}]}
            self.svc.plan.cni.cache.write(
                CacheEntry(
                    pod.id, "eth0", "podnet", CONFIG, netns=pod.netns, cni_args=pod.cni_args(), result=result
                )
            )
            self.pods.append(pod)
        self.svc.verifier._inspector = FakeInspector(set(), set())
        self.svc.plan.check_entry = self.check_entry
        self.svc.plan.repair = self.repair
        self.hold = True
        self.gate = asyncio.Event()
        self.errors: dict[str, str] = {}
        self.started: list[str] = []
        self.finished: list[str] = []
        self.repaired: list[str] = []
        self.running = self.peak = 0
        self.unlocked_or_not_niced: list[str] = []
        self.in_round: list[bool] = []  # per CHECK started: inside a round (Verifier.run)

    async def check_entry(self, entry: CacheEntry, path: str) -> str:
        pod_id = entry.container_id
        if not self.svc.locks.busy(pod_id) or PLUGIN_NICE.get() != GC_PLUGIN_NICE:
            self.unlocked_or_not_niced.append(pod_id)
        self.started.append(pod_id)
        self.in_round.append(self.svc.verifier._round.locked())
        self.running += 1
        self.peak = max(self.peak, self.running)
        if self.hold:
            await self.gate.wait()
        self.running -= 1
        self.finished.append(pod_id)
        return self.errors.get(pod_id, "")

    async def repair(self, pod: PodInfo, **_: Any) -> None:
        self.repaired.append(pod.id)

    def status(self) -> dict[str, Any]:
        st = self.daemon.reports.status()
        return {**st["verify"], "background": st["tracked"]["background"]}

    def run(self, scenario):
        async def whole():
            self.svc.roster.listed(self.pods)
            try:
                return await scenario()
            finally:
                self.gate.set()
                await self.svc.close()

        return asyncio.run(whole())


def test_the_round_returns_before_its_checks_which_follow_a_few_at_once(tmp_path):
    node = Node(tmp_path, 8)
    svc = node.svc

    async def scenario():
        verdicts = await svc.timers.verify()
        returned = (len(node.finished), node.status())
        node.gate.set()
        await svc.verifier.checker.idle()
        return verdicts, returned, node.status()

    verdicts, (finished, at_return), after = node.run(scenario)
    assert sorted(h.pod_id for h in verdicts) == sorted(p.id for p in node.pods)
    assert {h.state.value for h in verdicts} == {"ok"}  # netlink's verdict
    # returned with no CHECK finished: the round done, its CHECKs not, each pod's CHECK pending
    assert finished == 0
    assert (at_return["rounds"], at_return["checkedRounds"], at_return["background"]) == (1, 0, 8)
    assert at_return["checksDone"] is None
    assert (after["rounds"], after["checkedRounds"], after["background"]) == (1, 1, 0)
    assert after["checksDone"] >= after["lastRound"]
    assert sorted(node.finished) == sorted(p.id for p in node.pods)  # each once
    assert node.peak == min(check_parallel(), 8) and node.unlocked_or_not_niced == []
    assert node.in_round == [False] * 8  # each began after the round returned


@pytest.mark.parametrize(("check_every", "checked"), [(10000, 1), (1, 0)])  # 1: the control, CHECKs queued
def test_a_round_with_no_check_due_has_its_checks_done_as_it_returns(tmp_path, check_every, checked):
    node = Node(tmp_path, 3, check_every)

    async def scenario():
        await node.svc.timers.verify()
        return node.status()

    status = node.run(scenario)
    assert (status["rounds"], status["checkedRounds"]) == (1, checked)
    assert (status["checksDone"] == status["lastRound"]) is bool(checked)


@pytest.mark.parametrize(
    ("by_hand", "in_round"),
    [
        ({}, False),  # the control: the timer's round queues them; they run after it returned
        ({"check": True}, True),  # nri-cni verify --check: every CHECK's outcome in the answer
        ({"pod": 1}, True),  # nri-cni verify POD: its CHECK's outcome in the answer
    ],
)
def test_a_round_asked_for_by_hand_returns_with_its_checks(tmp_path, by_hand, in_round):
    node = Node(tmp_path, 8)
    node.hold = False
    failing = node.pods[0]
    node.errors[failing.id] = "bridge: no such link"
    pod_id = node.pods[by_hand["pod"] - 1].id if "pod" in by_hand else None

    async def scenario():
        verdicts = await node.svc.timers.verify(pod_id, check=by_hand.get("check", False))
        at_return = (len(node.finished), list(node.repaired))
        await node.svc.verifier.checker.idle()
        return verdicts, at_return, node.status()

    verdicts, (finished, repaired), status = node.run(scenario)
    assert len(node.started) == (1 if pod_id else 8)
    assert node.in_round == [in_round] * len(node.started)  # each CHECK inside the round, or after it
    states = {h.pod_id: h.state.value for h in verdicts}
    assert states[failing.id] == ("repaired" if in_round else "ok")  # its failed CHECK's, or netlink's
    if in_round:
        assert (finished, repaired) == (len(node.started), [failing.id])
    # either way the failed CHECK led to the repair, and the round's CHECKs are done
    assert node.repaired == [failing.id] and node.svc.health.get(failing.id).state.value == "repaired"
    assert status["checkedRounds"] == status["rounds"] == (0 if pod_id else 1)
    # `nri-cni status` says when a round's CHECKs were done: never for one pod's (no round)
    if pod_id:
        assert status["checksDone"] is None
    else:
        assert status["checksDone"] >= status["lastRound"]


def test_a_round_does_not_wait_for_the_checks_of_an_earlier_one_and_queues_no_pod_twice(tmp_path):
    node = Node(tmp_path, 8)
    svc = node.svc
    slots = min(check_parallel(), 8)

    async def scenario():  # the timer's rounds (Verifier.run as ServiceTimers.verify_tick runs it)
        await svc.verifier.run()
        await asyncio.sleep(0)  # the first CHECKs start and wait for the gate
        second = await svc.verifier.run()  # returns with the CHECKs of the first still held
        at_second = (len(node.started), len(node.finished), node.status())
        node.gate.set()
        await svc.verifier.checker.idle()
        after = len(node.finished)
        await svc.verifier.run()  # the control: nothing pending, each pod is queued again
        await svc.verifier.checker.idle()
        return second, at_second, after, node.status()

    second, (started, finished, at_second), after, status = node.run(scenario)
    # the pods being CHECKed are busy: left out of the second round; the others judged by netlink
    assert len(second) == 8 - slots and started == slots and finished == 0
    assert (at_second["rounds"], at_second["checkedRounds"], at_second["background"]) == (2, 0, 8)
    assert after == 8  # each pod CHECKed once for both rounds, not queued twice
    assert len(node.finished) == 16 and (status["rounds"], status["checkedRounds"]) == (3, 3)


def _stopped(node: Node, pod: PodInfo) -> None:
    node.svc.roster.stopped(pod.id)


def _removed(node: Node, pod: PodInfo) -> None:
    node.svc.roster.removed(pod.id)


def _collected(node: Node, pod: PodInfo) -> None:
    """A pod list without it, and GC's DEL of its attachment."""
    node.svc.roster.listed([p for p in node.pods if p is not pod])
    node.svc.plan.cni.cache.delete("podnet", pod.id, "eth0")


def _netns_gone(node: Node, pod: PodInfo) -> None:
    os.unlink(pod.netns)


def _nothing(node: Node, pod: PodInfo) -> None:
    pass


@pytest.mark.parametrize(
    ("change", "checks"),
    [(_nothing, 1), (_stopped, 0), (_removed, 0), (_collected, 0), (_netns_gone, 0)],  # _nothing: the control
)
def test_a_pod_gone_before_its_check_starts_is_not_checked_nor_attached_again(tmp_path, change, checks):
    slots = check_parallel()
    node = Node(tmp_path, slots + 1)  # one pod's CHECK waits for a slot: the target

    async def scenario():
        await node.svc.timers.verify()
        await asyncio.sleep(0)  # the other pods' CHECKs hold every slot
        (target,) = [p for p in node.pods if p.id not in node.started]
        assert node.svc.verifier.checker.pending() == slots + 1
        change(node, target)
        node.gate.set()
        await node.svc.verifier.checker.idle()
        return target

    target = node.run(scenario)
    assert node.started.count(target.id) == checks
    assert node.repaired == []  # nothing of it ADDed again
    assert len(node.finished) == slots + checks


@pytest.mark.parametrize(
    ("error", "state"), [("", "ok"), ("bridge: no such link", "repaired")]
)  # "": the control
def test_a_queued_check_that_fails_leads_to_the_repair(tmp_path, error, state):
    node = Node(tmp_path, 3)
    node.hold = False
    target = node.pods[1]
    node.errors[target.id] = error

    async def scenario():
        verdicts = await node.svc.timers.verify()
        await node.svc.verifier.checker.idle()
        return verdicts

    verdicts = node.run(scenario)
    assert {h.pod_id: h.state.value for h in verdicts}[target.id] == "ok"  # the round's: netlink's
    health = node.svc.health.get(target.id)
    assert health is not None and health.state.value == state
    assert node.repaired == ([target.id] if error else [])


@pytest.mark.parametrize(
    ("check_every", "check", "waits"), [(1, True, True), (1, False, True), (10000, True, False)]
)  # 10000: the control
def test_a_round_on_demand_waits_for_the_checks_still_queued(tmp_path, check_every, check, waits):
    """nri-cni verify (--check or not) after a timer's round: it starts once that round's
    CHECKs are done (a pod being CHECKed would be busy, left out of its answer). Control: no
    CHECK queued (none due) -> it starts at once."""
    node = Node(tmp_path, 8, check_every)
    svc = node.svc

    async def scenario():
        await svc.verifier.run()  # the timer's round: with check_every 1 its CHECKs are held
        forced = asyncio.create_task(svc.timers.verify(check=check))
        for _ in range(5):  # more turns than the forced round needs to start (Verifier.rounds)
            await asyncio.sleep(0)
        started = svc.verifier.rounds
        node.gate.set()
        return started, await forced

    started, verdicts = node.run(scenario)
    assert started == (1 if waits else 2)
    assert len(verdicts) == 8  # every pod in its answer


@pytest.mark.parametrize("rounds", [2, 1], ids=["next-round-first", "control-one-round"])
def test_a_queued_check_is_of_the_round_that_queued_it(tmp_path, rounds):
    """Each attachment's CHECK every 2 rounds: round 1 queues the pods whose turn it is; round
    2 starts before their CHECKs do. Those CHECKs run all the same (they are round 1's), then
    round 2's pods'. Control: round 1 alone -> its pods CHECKed, the others not (not their turn)."""
    node = Node(tmp_path, 4, check_every=2)
    node.hold = False
    policy = VerifyPolicy(check_every=2)
    turn = {r: sorted(p.id for p in node.pods if policy.check_due(f"{p.id}/podnet/eth0", r)) for r in (1, 2)}
    assert turn[1] and turn[2]  # these pod ids have both turns

    async def scenario():
        await node.svc.verifier.run()  # round 1 queues its CHECKs; none has started
        if rounds == 2:
            await node.svc.verifier.run()
        await node.svc.verifier.checker.idle()

    node.run(scenario)
    expected = turn[1] + (turn[2] if rounds == 2 else [])
    assert sorted(node.started) == sorted(expected)
