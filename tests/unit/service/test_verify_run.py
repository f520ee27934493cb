"""A verify round as its caller sees it (Verifier.run): what it reports per network and per pod,
the pods whose netns path is gone, a pod busy or stopped while the round reads it, the cadence
CHECKs the round leaves to the checker, the CHECKs asked for by hand. Each test states its
control case: the same round with the one input changed that flips the outcome. Without root:
the plugins are the fake executor's, the node inspector a fake (tests/support/verifyworld.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.exec_errors import Ended
from nri_cni.config import parse_config
from nri_cni.errors import NriCniError
from nri_cni.node import VerifyPolicy
from nri_cni.pod.select import NETWORKS_ANNOTATION
from nri_cni.service import verify
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from tests.support import verifyworld

POD, OTHER = "e9" * 32, "ea" * 32
IP = "10.79.0.2"
BUSY = Ended(stdout=b'{"cniVersion":"1.1.0","code":11,"msg":"busy"}', status=1)
NEVER_DUE = {"check_every": 10000}  # no cadence CHECK in the first rounds (asserted where it matters)


def World(tmp: Path, **kw: Any) -> verifyworld.World:
    return verifyworld.World(tmp, tag="e9", ip=IP, **kw)


def _seen(health: PodHealth) -> list[tuple[str, str, str]]:
    return [(a.network, a.ifname, a.finding) for a in health.attachments]


def _slot(check_every: int) -> int:
    return VerifyPolicy(check_every=check_every).slot(f"{POD}/podnet/eth0")


async def _hold(w: verifyworld.World, held: asyncio.Event, release: asyncio.Event) -> None:
    """An operation on the pod in flight: its lock held until `release`."""
    async with w.svc.locks.pod(POD):
        held.set()
        await release.wait()


@pytest.mark.parametrize("damaged", [False, True], ids=["ok", "control-damaged"])
def test_an_ok_round_reports_each_network_it_read(tmp_path, damaged):
    """An intact pod's verdict lists its one attachment as ok. Control: eth0 found damaged and
    its repair failing -> the same attachment with netlink's finding (the verdict stands
    broken, not ok)."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def scenario() -> PodHealth:
        await w.attached_and_listed()
        if damaged:
            w.inspector.answers = ["damaged"]
            w.other_pod_holds(OTHER, IP)  # the repair must not take it: broken, nothing changed
        (health,) = await w.svc.verifier.run()
        return health

    health = w.run(scenario)
    if damaged:
        assert health.state is PodState.BROKEN
        assert _seen(health) == [("podnet", "eth0", "link-missing")]
    else:
        assert health.state is PodState.OK
        assert _seen(health) == [("podnet", "eth0", "ok")]


def test_a_pod_entering_and_leaving_broken_is_named_in_the_log(tmp_path, caplog):
    """eth0 found damaged, its IP held by another pod: the pod enters broken (ip-taken), one
    log line naming it namespace/name; the next round reads it intact: it leaves broken, one
    log line naming it. Control: the round in between reads it the same -> no second line
    (the pod stays broken, since kept)."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def scenario() -> list[PodState]:
        await w.attached_and_listed()
        w.other_pod_holds(OTHER, IP)
        w.inspector.answers = ["damaged", "damaged"]
        states = [h.state for h in await w.svc.verifier.run()]  # enters broken
        states += [h.state for h in await w.svc.verifier.run()]  # control: stays broken
        states += [h.state for h in await w.svc.verifier.run()]  # read intact: ok
        return states

    with caplog.at_level(logging.INFO, logger="nri_cni.daemon"):
        states = w.run(scenario)
    assert states == [PodState.BROKEN, PodState.BROKEN, PodState.OK]
    lines = [r.getMessage() for r in caplog.records if POD in r.getMessage()]
    entered = [line for line in lines if "is broken (ip-taken)" in line]
    left = [line for line in lines if "is no longer broken (ip-taken)" in line]
    assert len(entered) == 1 and entered[0].startswith(f"pod default/e9-pod id={POD} is broken")
    assert len(left) == 1 and left[0].startswith(f"pod default/e9-pod id={POD} is no longer broken")


def test_a_repaired_pod_says_what_was_repaired(tmp_path):
    """eth0 found damaged and repaired: the verdict's reason names the attachment and what
    netlink found. Control: the next round reads it intact -> it stays "repaired" with that
    reason and its one repair (ok keeps a repaired pod's reason)."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def scenario() -> tuple[PodHealth, PodHealth]:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"]
        (first,) = await w.svc.verifier.run()
        first = dataclasses.replace(first)
        (again,) = await w.svc.verifier.run()
        return first, again

    first, again = w.run(scenario)
    assert first.state is PodState.REPAIRED and again.state is PodState.REPAIRED
    assert isinstance(first.reason, str) and "podnet/eth0: no eth0" in first.reason
    assert (again.reason, again.repairs) == (first.reason, 1)


@pytest.mark.parametrize("by_hand_repair", [True, False], ids=["repaired-by-hand", "control-not"])
def test_a_repair_that_succeeds_forgets_the_failed_tries(tmp_path, by_hand_repair):
    """eth0 found damaged, its repair fails (a backoff wait of FIRST_RETRY starts). Asked by
    hand (`nri-cni verify POD`, no wait) the repair succeeds: its failed tries are forgotten, so
    when eth0 is found damaged again before the wait is over, the timer's round repairs at once.
    Control: no repair by hand in between -> the timer's round inside the wait tries nothing."""
    w = World(tmp_path, verify=NEVER_DUE)
    w.svc.verifier.clock = lambda: 100.0  # the wait never ends in this test

    async def scenario() -> bool:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"]
        w.add_answer = BUSY
        await w.svc.verifier.run()  # fails: the wait starts
        w.add_answer = None
        if by_hand_repair:  # eth0 is missing since the failed repair (its rollback)
            (health,) = await w.svc.verifier.run(POD)
            assert health.state is PodState.REPAIRED
        w.inspector.answers = ["damaged"]
        before = w.adds()
        await w.svc.verifier.run()
        return w.adds() > before

    assert w.run(scenario) is by_hand_repair


@pytest.mark.parametrize("settles", [True, False], ids=["ok-settles", "control-backing-off"])
def test_a_pod_verify_finds_true_has_no_attach_retry_left(tmp_path, settles):
    """A pod whose attach failed earlier (the roster's pending repair) and that a round finds
    intact: no attach retry is left for it. Control: a round that backs off from a failed
    repair (the verdict stands) -> the attach retry stays."""
    w = World(tmp_path, verify=NEVER_DUE)
    w.svc.verifier.clock = lambda: 100.0

    async def scenario() -> frozenset[str]:
        await w.attached_and_listed()
        if not settles:
            w.inspector.answers = ["damaged"]
            w.add_answer = BUSY
            await w.svc.verifier.run()  # fails: the wait starts
            w.inspector.answers = ["damaged"]
        w.svc.roster.attach_failed(POD)
        assert POD in w.svc.roster.pending_repair()
        await w.svc.verifier.run()
        return w.svc.roster.pending_repair()

    assert (POD in w.run(scenario)) is not settles


@pytest.mark.parametrize("backoff", [True, False], ids=["backing-off", "control-fresh"])
def test_a_round_backing_off_answers_the_verdict_that_stands(tmp_path, backoff):
    """The pod was ok; then eth0 is found damaged and its repair fails: the round answers the
    pod's last verdict (it stands, repair failing), and the round inside the wait too. Control:
    no failure: the pod's fresh verdict each round."""
    w = World(tmp_path, verify=NEVER_DUE)
    w.svc.verifier.clock = lambda: 100.0

    async def scenario() -> list[list[PodHealth]]:
        await w.attached_and_listed()
        answers = [await w.svc.verifier.run()]
        if backoff:
            w.add_answer = BUSY
            w.inspector.answers = ["damaged", "damaged"]
        answers.append(await w.svc.verifier.run())  # the repair fails
        answers.append(await w.svc.verifier.run())  # inside the wait: nothing tried
        return answers

    ok, failed, waiting = w.run(scenario)
    assert [h.state for h in ok] == [PodState.OK]
    assert failed == ok and waiting == ok  # the same entry, the last verdict (ok) stands
    assert w.adds() == (2 if backoff else 1)


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped-while-read", "control"])
def test_a_pod_stopped_while_the_round_reads_it_gets_no_verdict_from_it(tmp_path, stopped):
    """The pod was ok; the runtime stops it while the next round reads it (intact): that round
    answers nothing for it. Control: not stopped -> its verdict, ok."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def stop() -> None:
        await w.svc.verbs.detach(w.pod, stop_event=True)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        await w.svc.verifier.run()
        if stopped:
            w.inspector.on_inspect = stop
        return await w.svc.verifier.run()

    answer = w.run(scenario)
    assert [h.state for h in answer] == ([] if stopped else [PodState.OK])


@pytest.mark.parametrize("attached", [True, False], ids=["attached", "never-attached"])
@pytest.mark.parametrize("gone", [True, False], ids=["path-gone", "control-path-there"])
def test_a_pod_whose_netns_path_is_gone_is_broken_unreadable_with_each_attachment(tmp_path, attached, gone):
    """The runtime lists the pod, its pause process runs, its netns path is gone: nothing is
    read (netlink is not asked about it), the pod is broken "netns-unreadable" with each of its
    attachments so named (none when nri-cni never attached it). Control: the path there ->
    netlink reads it, ok (or eth0 missing and added when never attached)."""
    w = World(tmp_path, verify=NEVER_DUE)
    w.pod = dataclasses.replace(w.pod, pid=os.getpid())  # a pause process that runs

    async def scenario() -> PodHealth:
        if attached:
            await w.attached_and_listed()
        else:
            w.svc.roster.listed([w.pod])
        if gone:
            os.remove(w.pod.netns)
        w.inspector.asked.clear()
        (health,) = await w.svc.verifier.run()
        return health

    health = w.run(scenario)
    if gone:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE)
        assert _seen(health) == ([("podnet", "eth0", "netns-unreadable")] if attached else [])
        assert all(w.pod.netns in a.detail for a in health.attachments)
        assert w.inspector.asked == []
    else:
        assert POD in w.inspector.asked
        assert health.state is (PodState.OK if attached else PodState.REPAIRED)


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "control-free"])
def test_a_pod_whose_operation_starts_while_the_round_reads_it_is_left_to_the_next(tmp_path, busy):
    """The pod's cadence CHECK is due this round (check_every 1); an operation on it starts
    while the round reads it (its lock taken) and ends after the round. The round answers
    nothing for it, and its CHECK, run after the round, finds the pod busy and runs nothing
    (the next round's). Control: no operation -> the round answers ok and the CHECK runs."""
    w = World(tmp_path, verify={"check_every": 1})
    held, release = asyncio.Event(), asyncio.Event()
    holder: list[asyncio.Task[None]] = []

    async def start_operation() -> None:
        holder.append(asyncio.create_task(_hold(w, held, release)))
        await held.wait()

    async def scenario() -> tuple[list[PodHealth], int]:
        await w.attached_and_listed()
        if busy:
            w.inspector.on_inspect = start_operation
        answer = await w.svc.verifier.run()
        # one turn of the loop: the checker's task (queued by the round) runs to its first
        # wait, which, the pod busy, is its end (the busy test comes before any await)
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*holder)
        await w.svc.verifier.checker.idle()
        return answer, w.fake.commands().count("CHECK")

    answer, checks = w.run(scenario)
    if busy:
        assert (answer, checks) == ([], 0)
    else:
        assert ([h.state for h in answer], checks) == ([PodState.OK], 1)


@pytest.mark.parametrize("next_round_first", [True, False], ids=["next-round-first", "control-idle"])
def test_a_cadence_check_follows_the_turn_of_the_round_that_queued_it(tmp_path, next_round_first):
    """check_every 2: the round whose turn eth0's CHECK is queues it; the next round (not its
    turn) starts before the checker ran it. The CHECK runs all the same, once: its turn is the
    queueing round's. Control: the checker done before the next round -> the same one CHECK
    (and the next round, not its turn, runs none of its own)."""
    w = World(tmp_path, verify={"check_every": 2})

    async def scenario() -> int:
        await w.attached_and_listed()
        v = w.svc.verifier
        while not v.checker.pending():  # the rounds until eth0's turn
            assert v.rounds < 2
            await v.run()
        assert v.rounds % 2 == _slot(2)
        if not next_round_first:
            await v.checker.idle()
        await v.run()  # not eth0's turn
        await v.checker.idle()
        return w.fake.commands().count("CHECK")

    assert w.run(scenario) == 1


@pytest.mark.parametrize("pod", [POD, None], ids=["one-pod", "control-all-pods"])
def test_checks_asked_for_one_pod_leave_the_rounds_checks_state_alone(tmp_path, pod):
    """`nri-cni verify POD --check`: its CHECK runs in it, but it is no round over every pod,
    so the book's "cadence CHECKs done" stays unset. Control: `--check` of all pods -> set."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.verifier.run(pod, check=True)

    (health,) = w.run(scenario)
    assert health.state is PodState.OK and w.fake.commands().count("CHECK") == 1
    assert (w.svc.health.checks_done_at is None) is (pod is not None)


@pytest.mark.parametrize("check", [True, False], ids=["forced", "control-cadence"])
def test_a_check_asked_for_by_hand_runs_for_a_pod_with_a_difference(tmp_path, check):
    """The runtime reports an IP eth0 does not hold (a difference: the pod is settled in the
    round, not left to the checker); its cadence CHECK is not due. `--check` CHECKs it all the
    same. Control: no `--check` -> no CHECK."""
    w = World(tmp_path, verify=NEVER_DUE)

    async def scenario() -> int:
        await w.svc.verbs.attach(w.pod)
        w.svc.roster.listed([dataclasses.replace(w.pod, ips=("10.79.0.99",))])
        assert (w.svc.verifier.rounds + 1) % 10000 != _slot(10000)  # not eth0's turn
        await w.svc.verifier.run(check=check)
        return w.fake.commands().count("CHECK")

    assert w.run(scenario) == (1 if check else 0)


@pytest.mark.parametrize("first_round", ["refused", "none"], ids=["refused-round", "control-no-round"])
def test_the_node_inspector_is_made_at_the_first_round_even_a_refused_one(tmp_path, monkeypatch, first_round):
    """A verifier without an inspector makes it at its first round, even one refused (a pod
    the runtime does not list): its fd is held from then on. Control: no round -> none made."""
    w = World(tmp_path)
    made: list[verifyworld.Inspector] = []

    def with_workers() -> verifyworld.Inspector:
        made.append(verifyworld.Inspector())
        return made[-1]

    monkeypatch.setattr(verify.NodeInspector, "with_workers", staticmethod(with_workers))
    w.svc.verifier._inspector = None

    async def scenario() -> None:
        if first_round == "refused":
            with pytest.raises(NriCniError, match="no pod"):
                await w.svc.verifier.run(OTHER)

    w.run(scenario)
    assert len(made) == (1 if first_round == "refused" else 0)


def _with_side_network(w: verifyworld.World, tmp: Path) -> None:
    """The world's pod asks (by annotation) for a second network, "sidenet" (net1), of the same
    plugin: the pod plan's config (which selects the pod's networks) gets that network, allowed
    in every namespace; the verifier's keeps the world's (its verify section)."""
    doc = {
        "mode": "shim",
        "state_dir": str(tmp / "state"),
        "repair_on_sync": False,
        "networks": [
            {"name": "podnet", "default": True, "conflist": w.conflist},
            {"name": "sidenet", "namespaces": ["*"], "conflist": {**w.conflist, "name": "sidenet"}},
        ],
    }
    w.plan.source.replace(parse_config(doc, str(tmp / "config.yaml")))
    w.pod = dataclasses.replace(w.pod, annotations={NETWORKS_ANNOTATION: "sidenet"})


@pytest.mark.parametrize("check_every, checks", [(2, 1), (1, 2)], ids=["one-turn", "control-both-turns"])
def test_the_checker_checks_only_the_attachments_whose_turn_it_is(tmp_path, check_every, checks):
    """A pod with two attachments (eth0, net1), netlink finds both intact; check_every 2: their
    turns fall in different rounds, and the first round's CHECK, run by the checker after it,
    CHECKs the one whose turn it is, not both. Control: check_every 1 -> both CHECKed."""
    w = World(tmp_path, verify={"check_every": check_every})
    _with_side_network(w, tmp_path)
    turns = {VerifyPolicy(check_every=2).slot(f"{POD}/{k}") for k in ("podnet/eth0", "sidenet/net1")}
    assert turns == {0, 1}  # round 1 is one of them's turn, not the other's

    async def scenario() -> int:
        await w.attached_and_listed()
        assert [e.key for e in w.plan.cached(POD)] == [("podnet", "eth0"), ("sidenet", "net1")]
        (health,) = await w.svc.verifier.run()
        assert health.state is PodState.OK and w.svc.verifier.checker.pending() == 1
        await w.svc.verifier.checker.idle()
        return w.fake.commands().count("CHECK")

    assert w.run(scenario) == checks


@pytest.mark.parametrize("ips_lost", [False, True], ids=["never-had-ips", "control-ips-lost"])
def test_a_secondary_mode_pod_the_runtime_lists_without_ip_is_judged_by_its_record(tmp_path, ips_lost):
    """Secondary mode (the runtime's own network is the primary), netlink finds the pod's
    network intact and its CHECK is due (check_every 1, left to the checker), the runtime lists
    the pod with no IP: its record never had one, so nothing is lost: ok. Control: the runtime
    listed it with an IP before and now without -> its own network is gone: torn-down."""
    w = World(tmp_path, verify={"check_every": 1})
    doc = {
        "mode": "secondary",
        "primary_network": "runtimenet",
        "state_dir": str(tmp_path / "state"),
        "repair_on_sync": False,
        "verify": {"check_every": 1},
        "networks": [{"name": "podnet", "default": True, "conflist": w.conflist}],
    }
    # the verifier's config (each round takes its mode from it); the pod plan's, which
    # attaches the pod, stays the world's: the same network either way
    w.svc.verifier.source.replace(parse_config(doc, str(tmp_path / "config.yaml")))

    async def scenario() -> PodHealth:
        await w.svc.verbs.attach(w.pod)
        if ips_lost:
            w.svc.roster.listed([w.pod])
        w.svc.roster.listed([dataclasses.replace(w.pod, ips=())])
        (health,) = await w.svc.verifier.run()
        await w.svc.verifier.checker.idle()
        return health

    health = w.run(scenario)
    if ips_lost:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.TORN_DOWN)
    else:
        assert health.state is PodState.OK
