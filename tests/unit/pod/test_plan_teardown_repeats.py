"""A pod's teardown arrives two to four times (NRI stop and remove, the runtime's CNI DELs):
the detach that did the work remembers that nothing of the pod is left, so the repeats neither
list the cache nor run a plugin, until something may have written the pod's records again (an
attach, a repair) or the runtime removed the pod (`last`). In-process plugins (FakeExecutor); no root."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import PodError
from nri_cni.pod import plan as plan_module
from nri_cni.pod.model import AttachRequest, PodInfo
from nri_cni.pod.repair import repair_selection
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan

NET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "t3-br"}]}
DEL_FAILS = Ended(stdout=json.dumps({"cniVersion": "1.1.0", "code": 11, "msg": "busy"}).encode(), status=1)


def _add(call) -> bytes:
    return json.dumps({"cniVersion": "1.1.0", "ips": [{"address": "10.78.0.2/24"}]}).encode()


class World:
    def __init__(self, tmp_path, *, del_fails: bool = False) -> None:
        self.fake = FakeExecutor({"t3-br": {"ADD": _add, "DEL": DEL_FAILS if del_fails else b""}})
        doc = {
            "state_dir": str(tmp_path / "state"),
            "networks": [{"name": "podnet", "default": True, "conflist": NET}],
        }
        self.cfg = parse_config(doc, str(tmp_path / "config.yaml"))
        self.plan = pod_plan(self.cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=self.fake))
        self.lookups = 0
        listing = self.plan.cni.cache.entries

        def counted(*args, **kwargs):
            self.lookups += 1
            return listing(*args, **kwargs)

        self.plan.cni.cache.entries = counted  # type: ignore[method-assign]

    async def attach(self, pod: PodInfo) -> None:
        primary = mode_for(self.cfg).primary
        await self.plan.attach(pod, self.plan.select(pod, primary, AttachRequest()), AttachRequest())

    async def repair(self, pod: PodInfo) -> None:
        expected = self.plan.expected(pod, mode_for(self.cfg).primary)
        await self.plan.repair(
            pod, selected=repair_selection(expected, [], []), damaged=[], ips={}, wrong=["gone"]
        )

    def dels(self) -> int:
        return sum(c.command == "DEL" for c in self.fake.calls)


def _pod(n: int = 0) -> PodInfo:
    return PodInfo(f"{n:064x}", name=f"t3-{n}", namespace="default", netns="/run/netns/t3")


@pytest.mark.parametrize(
    "between, dels, lookups",
    [
        ("", 1, 0),  # the repeat: no cache listing, no plugin
        ("attach", 2, 1),  # control: attached again, the next teardown DELs
        ("repair", 2, 1),  # control: a repair ADDs, the next teardown DELs
        ("remove", 1, 1),  # control: removed by the runtime, a later DEL looks (and finds nothing)
    ],
)
def test_a_repeated_teardown_looks_again_only_after_what_may_have_written(tmp_path, between, dels, lookups):
    """`lookups`: the cache listings of the second detach alone."""
    world, pod = World(tmp_path), _pod()

    async def scenario() -> None:
        await world.attach(pod)
        await world.plan.detach(pod)
        if between == "attach":
            await world.attach(pod)
        elif between == "repair":
            await world.repair(pod)
        elif between == "remove":
            await world.plan.detach(pod, last=True)
        world.lookups = 0
        await world.plan.detach(pod)

    asyncio.run(scenario())
    assert (world.dels(), world.lookups) == (dels, lookups)
    assert world.plan.cached(pod.id) == []


def test_a_teardown_that_found_nothing_or_was_the_last_is_not_remembered(tmp_path):
    """A pod never attached (or removed before the runtime's late DEL): each teardown looks at
    the cache; nothing is kept of it. Nor of a pod whose removal did the work. Control: a
    stop that did the work is remembered."""
    world, never, removed, stopped = World(tmp_path), _pod(1), _pod(2), _pod(3)

    async def scenario() -> None:
        await world.plan.detach(never)
        await world.plan.detach(never)
        await world.attach(removed)
        await world.plan.detach(removed, last=True)
        await world.attach(stopped)
        await world.plan.detach(stopped)

    asyncio.run(scenario())
    assert world.plan._bare == {stopped.id: None}
    assert world.dels() == 2


def test_a_failed_teardown_is_tried_again(tmp_path):
    """The DEL failed: the attachment stays cached, and the next teardown DELs it again."""
    world, pod = World(tmp_path, del_fails=True), _pod()

    async def scenario() -> None:
        await world.attach(pod)
        for _ in range(2):
            with pytest.raises(PodError, match="busy"):
                await world.plan.detach(pod)

    asyncio.run(scenario())
    assert world.dels() == 2 and len(world.plan.cached(pod.id)) == 1


def test_only_the_newest_teardowns_are_remembered(tmp_path, monkeypatch):
    """Pods the runtime never removes (containerd after its restart): past BARE_KEPT the oldest
    is dropped, and its next teardown looks at the cache again. Control: the two newest do not."""
    monkeypatch.setattr(plan_module, "BARE_KEPT", 2)
    world = World(tmp_path)
    pods = [_pod(n) for n in range(3)]

    async def scenario() -> list[int]:
        for pod in pods:
            await world.attach(pod)
            await world.plan.detach(pod)
        seen = []
        for pod in (pods[0], pods[1], pods[2]):
            world.lookups = 0
            await world.plan.detach(pod)
            seen.append(world.lookups)
        return seen

    assert asyncio.run(scenario()) == [1, 0, 0]
