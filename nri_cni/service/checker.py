"""The cadence CHECKs of a verify round, run after it (verify.py): the round queues the pods
netlink found intact whose CHECK it is their turn for and returns with its verdicts; here each
pod's CHECK runs in a task of its own, `parallel` at a time. A pod already queued or being
CHECKed is not queued again. When nothing is left queued or running, every round queued so far
has its CHECKs done (`done`). What a CHECK is, its pod's lock and what its failure leads to
are the verifier's (`run`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from nri_cni.service.podcheck import PodCheck

log = logging.getLogger("nri_cni.daemon")


@dataclass(frozen=True)
class CheckJob:
    """One pod's CHECK: the round's reading of it, and the round whose turn it is (the cadence
    picks the attachments by the round's number: VerifyPolicy.needs_check)."""

    check: PodCheck
    round_no: int


def admitted(pod_ids: Sequence[str], pending: Collection[str]) -> list[str]:
    """The pods to queue, in order: each once, none that is already queued or being CHECKed."""
    out: list[str] = []
    for pod_id in pod_ids:
        if pod_id not in pending and pod_id not in out:
            out.append(pod_id)
    return out


class Checker:
    def __init__(
        self, run: Callable[[CheckJob], Awaitable[object]], *, parallel: int, done: Callable[[], None]
    ) -> None:
        """`run`: one pod's CHECK (and its repair); `parallel`: CHECKs at once; `done`: told
        each time the last CHECK queued or running ends."""
        self._run = run
        self._done = done
        self._slots = asyncio.Semaphore(parallel)
        self._tasks: dict[str, asyncio.Task[None]] = {}  # pod id -> its CHECK, queued or running
        self._running: set[str] = set()
        self._closed = False

    def queue(self, jobs: Sequence[CheckJob]) -> None:
        """A round's CHECKs. Returns at once (with none pending, the round's CHECKs are done:
        the round says so itself). Nothing is queued once closed (a round the stop cut short)."""
        by_pod = {j.check.pod.id: j for j in reversed(jobs)}  # the first job of a pod
        for pod_id in [] if self._closed else admitted([j.check.pod.id for j in jobs], self._tasks):
            task = asyncio.create_task(self._one(by_pod[pod_id]), name=f"verify-check {pod_id[:12]}")
            task.add_done_callback(functools.partial(self._finished, pod_id))
            self._tasks[pod_id] = task

    def pending(self) -> int:
        """Pods queued or being CHECKed."""
        return len(self._tasks)

    async def idle(self) -> None:
        """Returns once every CHECK queued until now has finished (a caller cancelled cancels none)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    async def close(self) -> None:
        """The daemon's stop: the CHECKs not started are cancelled, the running ones (and the
        repair a failed one leads to) finish; no task is left."""
        self._closed = True
        for pod_id, task in self._tasks.items():
            if pod_id not in self._running:
                task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _one(self, job: CheckJob) -> None:
        pod = job.check.pod
        try:
            async with self._slots:
                self._running.add(pod.id)
                await self._run(job)
        except Exception as exc:  # the pod's verdict stands; its next turn comes
            log.warning(
                "verify: pod %s id=%s: its CHECK did not run to its end: %s", pod.label(), pod.id, exc
            )

    def _finished(self, pod_id: str, _task: asyncio.Task[None]) -> None:
        """A CHECK ended, ran or cancelled (a task cancelled before it started runs no code of its own)."""
        self._running.discard(pod_id)
        del self._tasks[pod_id]
        if not self._tasks and not self._closed:
            self._done()
