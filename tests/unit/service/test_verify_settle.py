"""One pod's part of a verify round (Verifier._settle): judged without its lock when there is
nothing to run, else under it; left to the next round while an operation holds it; read again
when an operation changed its attachments since the round read it; a pod whose runtime network
is lost (secondary mode) judged without a CHECK; the CHECK run in the pod's listed netns, its
error reported. Each test states its control case: the same round with the one input changed
that flips the outcome. Without root: the plugins are the fake executor's, the node inspector a
fake (tests/support/verifyworld.py)."""

from __future__ import annotations

import asyncio
import json
import zlib
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.service.podstate import PodHealth, PodState
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
