"""What a verify round reports in the cases a hand-made mutant of the round got past every test
(issue 30): a repair that leaves a network missing, an unreadable pod whose CHECK was due, a pod
torn down while the round read it. Each test states its control case: the same round with the
one thing changed that must flip the outcome. Without root: the plugins are the fake
executor's, the node inspector a fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nri_cni.pod.model import PodInfo
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from tests.support import verifyworld
from tests.support.verifyworld import Inspector

POD = "d7" * 32
IP = "10.77.0.2"


def World(tmp: Path, inspector: Inspector) -> verifyworld.World:
    return verifyworld.World(tmp, tag="d7", ip=IP, inspector=inspector)


@pytest.mark.parametrize("leaves_missing", [True, False], ids=["network-left-missing", "control-repaired"])
def test_a_repair_that_leaves_a_network_missing_is_not_repaired(tmp_path, leaves_missing):
    """eth0 found damaged; the repair DELs it and its ADD does not come back (a repair that
    stopped short). Not "repaired": retried, and broken repair-failed after three tries, the
    reason saying the network is missing. Control: the repair's ADD runs -> "repaired"."""
    w = World(tmp_path, Inspector("damaged"))
    repair = w.plan.repair

    async def short_repair(pod: PodInfo, **kw: Any) -> Any:
        return await repair(pod, **{**kw, "selected": []})  # DEL the damaged, ADD nothing

    if leaves_missing:
        w.plan.repair = short_repair  # type: ignore[method-assign]

    async def scenario() -> list[PodHealth | None]:
        await w.attached_and_listed()
        first = await w.svc.timers.verify()
        seen = [w.svc.health.get(POD)]
        if leaves_missing:
            assert first == [] and w.svc.view.attachments(POD) == []  # nothing claimed yet
            for _ in range(2):  # explicit rounds: no backoff wait
                await w.svc.timers.verify(POD)
            seen.append(w.svc.health.get(POD))
        return seen

    seen = w.run(scenario)
    if leaves_missing:
        assert seen[0] is None
        last = seen[-1]
        assert last is not None and (last.state, last.code) == (PodState.BROKEN, BrokenCode.REPAIR_FAILED)
        assert "networks missing" in last.reason
    else:
        (health,) = seen
        assert health is not None and health.state is PodState.REPAIRED, health
        assert w.fake.commands() == ["ADD", "CHECK", "DEL", "ADD"]


@pytest.mark.parametrize("readable", [False, True], ids=["host-unreadable", "control-readable"])
def test_an_unreadable_pod_whose_check_was_due_is_not_ok(tmp_path, readable):
    """A forced CHECK (`nri-cni verify --check`) of a pod whose host side netlink could not read:
    the CHECK passes, and the pod is still broken "unreadable" (unknown is never ok). Control:
    the same round with everything read -> ok."""
    w = World(tmp_path, Inspector("ok" if readable else "unreadable"))

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.timers.verify(check=True)

    (health,) = w.run(scenario)
    assert w.fake.commands() == ["ADD", "CHECK"]  # the CHECK was due, and ran
    assert w.svc.health.get(POD) is health
    if readable:
        assert health.state is PodState.OK, health
    else:
        assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.UNREADABLE), health
        assert "cannot read host links" in health.reason


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped-while-read", "control-repaired"])
def test_a_pod_torn_down_while_the_round_read_it_is_not_attached_again(tmp_path, stopped):
    """The round reads eth0 damaged; while it reads (before it takes the pod's lock) the runtime
    tears the pod down (its stop: DEL, cache entry gone). The round then leaves the pod alone:
    no ADD after the DEL, nothing cached, no verdict. Control: no stop while it reads -> the
    same round repairs the pod (DEL and ADD) and says "repaired"."""
    inspector = Inspector("damaged")
    w = World(tmp_path, inspector)

    async def stop() -> None:
        await w.svc.verbs.detach(w.pod, stop_event=True)

    if stopped:
        inspector.on_inspect = stop

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.timers.verify()

    verdicts = w.run(scenario)
    if stopped:
        assert verdicts == [] and w.svc.health.get(POD) is None
        assert w.fake.commands() == ["ADD", "DEL"] and w.svc.view.attachments(POD) == []
    else:
        assert [h.state for h in verdicts] == [PodState.REPAIRED]
        assert w.fake.commands() == ["ADD", "CHECK", "DEL", "ADD"]
