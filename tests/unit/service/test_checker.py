"""The queue of a verify round's cadence CHECKs (nri_cni/service/checker.py): which pods are
queued (a table), each pod once while queued or running, `parallel` at a time, `done` when
nothing is left, and the stop: the CHECKs not started cancelled, the running ones finished,
no task left and nothing logged. The CHECK itself is a fake here (tests/unit/service/
test_verify_checks.py has the verifier's)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nri_cni.pod.model import PodInfo
from nri_cni.service.checker import Checker, CheckJob, admitted
from nri_cni.service.podcheck import pod_check


@pytest.mark.parametrize(
    ("pod_ids", "pending", "queued"),
    [
        (["a", "b"], set(), ["a", "b"]),  # the control: nothing pending, each queued in order
        (["a", "b"], {"a"}, ["b"]),  # a queued or being CHECKed: not again
        (["a", "b"], {"a", "b"}, []),
        (["a", "b", "a"], set(), ["a", "b"]),  # twice in one round: once
        (["b", "a"], {"c"}, ["b", "a"]),  # another pod pending changes nothing
        ([], {"a"}, []),
    ],
)
def test_which_pods_are_queued(pod_ids, pending, queued):
    assert admitted(pod_ids, pending) == queued


def job(name: str, round_no: int = 1) -> CheckJob:
    pod = PodInfo(name * 8, name=name, namespace="chk", netns=f"/run/netns/{name}")
    return CheckJob(pod_check(pod, [], []), round_no)


class Fake:
    """The verifier's side: each CHECK waits for `gate`; what ran, the most at once, the `done`s."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[tuple[str, int]] = []
        self.finished: list[str] = []
        self.running = self.peak = self.done = 0

    async def run(self, j: CheckJob) -> None:
        self.started.append((j.check.pod.name, j.round_no))
        self.running += 1
        self.peak = max(self.peak, self.running)
        await self.gate.wait()
        self.running -= 1
        self.finished.append(j.check.pod.name)

    def checker(self, parallel: int) -> Checker:
        return Checker(self.run, parallel=parallel, done=self.count_done)

    def count_done(self) -> None:
        self.done += 1


def test_a_pod_queued_or_being_checked_is_not_queued_again_and_at_most_parallel_run():
    async def scenario():
        fake = Fake()
        checker = fake.checker(parallel=2)
        checker.queue([job("a"), job("b"), job("c")])  # a and b start, c waits for a slot
        await asyncio.sleep(0)
        assert [n for n, _ in fake.started] == ["a", "b"] and checker.pending() == 3
        checker.queue([job("a", 2), job("c", 2), job("d", 2)])  # a runs, c waits: only d is new
        assert checker.pending() == 4 and fake.done == 0
        fake.gate.set()
        await checker.idle()
        assert sorted(fake.started) == [("a", 1), ("b", 1), ("c", 1), ("d", 2)]
        assert fake.peak == 2 and checker.pending() == 0 and fake.done == 1
        checker.queue([job("a", 3)])  # the control: a finished, so it is queued again
        await checker.idle()
        assert fake.started[-1] == ("a", 3) and fake.done == 2
        await checker.close()

    asyncio.run(scenario())


def test_done_is_told_when_the_last_check_ends():
    async def scenario():
        fake = Fake()
        checker = fake.checker(parallel=2)
        checker.queue([])  # nothing to run: pending() says so (the round tells it itself)
        assert fake.done == 0 and checker.pending() == 0
        checker.queue([job("a"), job("b")])
        assert fake.done == 0 and checker.pending() == 2
        fake.gate.set()
        await checker.idle()
        assert fake.done == 1 and checker.pending() == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("stop", [True, False])  # False: the control, the queue runs out
def test_the_stop_cancels_the_checks_not_started_and_lets_the_running_ones_finish(stop, caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario():
        fake = Fake()
        checker = fake.checker(parallel=2)
        checker.queue([job(n) for n in "abcde"])
        await asyncio.sleep(0)  # a and b run, c, d and e wait for a slot
        fake.gate.set()  # a and b may go on; nothing runs until the next await
        await (checker.close() if stop else checker.idle())
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == [] and checker.pending() == 0
        if stop:
            checker.queue([job("f")])  # after the stop nothing is queued (a round it cut short)
            assert checker.pending() == 0
        return fake

    fake = asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    if stop:
        assert sorted(fake.finished) == ["a", "b"] and fake.done == 0
    else:
        assert sorted(fake.finished) == ["a", "b", "c", "d", "e"] and fake.done == 1


def test_a_check_that_raises_is_logged_and_the_queue_goes_on(caplog):
    async def scenario():
        ran: list[str] = []

        async def run(j: CheckJob) -> None:
            ran.append(j.check.pod.name)
            if j.check.pod.name == "a":
                raise RuntimeError("netlink went away")

        checker = Checker(run, parallel=1, done=lambda: None)
        checker.queue([job("a"), job("b")])
        await checker.idle()
        return ran

    assert asyncio.run(scenario()) == ["a", "b"]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "netlink went away" in warned[0] and "chk/a" in warned[0]
