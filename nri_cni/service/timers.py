"""The pod service's node-wide work, entered by the daemon's timers, the runtime's pod list and
the CLI: the runtime's pod list and what follows it (GC, then a verify round), GC, verify rounds,
the netns reaper and start-up recovery. Each pod's part runs under that pod's lock; GC DELs each
stale pod under its lock and runs only the plugins' GC verb alone (it waits for every operation
in flight and holds back new ones)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from nri_cni.errors import NriCniError
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import GcReport
from nri_cni.service.parts import ServiceParts
from nri_cni.service.podstate import BrokenCode, PodHealth
from nri_cni.service.verbs import shielded

log = logging.getLogger("nri_cni.daemon")


class ServiceTimers:
    def __init__(self, parts: ServiceParts) -> None:
        self.parts = parts
        self._background: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Stops the background work (GC and repair after a Synchronize)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def synchronized(self, pods: list[PodInfo]) -> None:
        """The runtime's full pod list (every (re)connection). Returns at once: GC and repair
        run afterwards, in the background, so Synchronize never outlives the runtime's timeout."""
        self.parts.roster.listed(pods)
        self._prune()
        log.info("synchronized: the runtime has %d pod(s)", len(pods))
        self._spawn(self._after_sync(), "after-sync")

    async def _after_sync(self) -> None:
        try:
            await self.gc(reason="synchronize")
        finally:  # a GC that failed still leaves the pods to verify
            if self.parts.cfg.repair_on_sync and self.parts.cfg.repair != "off":
                await self._round()

    async def gc(self, reason: str) -> GcReport:
        """GC against the roster's valid pods; refused before the runtime's first pod list."""
        if not self.parts.roster.synced:
            raise NriCniError(
                "no pod list from the runtime yet (not synchronized): GC would delete every attachment"
            )
        log.info("gc (%s): %d pod(s) listed by the runtime", reason, len(self.parts.roster.pods()))
        # asked again under each stale pod's lock: a pod attached (or listed) meanwhile is valid
        grace = self.parts.cfg.gc_unlisted_grace
        report = await self._collect(
            lambda: self.parts.roster.valid_pod_ids(self.parts.locks.pod_ids(), grace)
        )
        attached = self.parts.plan.attached_pod_ids()
        # a pod attached again after GC DELed it (an ADD during this GC) keeps its grace
        deleted = [name for name in report["deleted"] if name.split("/")[1] not in attached]
        self.parts.roster.collected(deleted, attached, grace)
        self._gc_outcome(report, attached)
        self._prune()
        return report

    def _gc_outcome(self, report: GcReport, attached: set[str]) -> None:
        """A pod whose DEL failed is forgotten once nothing of it is held; an unlisted pod whose
        DEL fails in GC is reported by name (del-failed), not retried silently for ever."""
        held = attached | set(self.parts.plan.intent_pod_ids())
        for health in self.parts.health.broken_pods():
            if health.code is BrokenCode.DEL_FAILED and health.pod_id not in held:
                log.info("pod id=%s: GC released what it held; no longer broken (del-failed)", health.pod_id)
                self.parts.health.forget(health.pod_id)
        for pod_id in held - set(self.parts.roster.pods()):
            errors = [e for e in report["errors"] if pod_id in e]
            if errors:
                self.parts.health.del_failed(pod_id, "; ".join(errors), label=pod_id[:12])

    def _prune(self) -> None:
        """The runtime's list is the roster: verdicts and repair retries of pods it does not
        list (a RemovePodSandbox lost while the connection was down) go; what nri-cni still
        holds of them (cache entries, intent records) stays until GC has released it."""
        listed = set(self.parts.roster.pods())
        # a pod whose DEL fails stays named (del-failed) until GC has released what it holds
        held = {h.pod_id for h in self.parts.health.broken_pods() if h.code is BrokenCode.DEL_FAILED}
        self.parts.health.retain(listed | held)
        self.parts.verifier.retain(listed)

    async def gc_listed(self, pod_ids: set[str]) -> GcReport:
        """The runtime's own GC of the shim's network: its valid attachments are its pods."""
        grace = self.parts.cfg.gc_unlisted_grace
        return await self._collect(
            lambda: pod_ids | self.parts.locks.pod_ids() | self.parts.roster.unconfirmed_valid(grace)
        )

    async def _collect(self, valid: Callable[[], set[str]]) -> GcReport:
        # The stale pods' DELs each take their pod's lock, the GC verb the exclusive one
        # (Upkeep.collect_garbage): a pod ADD meanwhile waits for nothing but its own pod.
        return await self.parts.plan.collect_garbage(
            valid, self.parts.locks, running=self.parts.roster.running
        )

    async def verify(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        """One verify round (service/verify.py): every pod the runtime lists running with a netns,
        or only `pod_id` (NriCniError when the runtime does not list it); `check` forces CNI
        CHECK of every attachment verified. Verdicts go to the health book, what differs is
        repaired per `repair`; each pod's part runs under its lock. Returns the verdicts (a
        round's cadence CHECKs follow it: service/checker.py). A round on demand over every
        pod waits for the CHECKs still queued first (a pod being CHECKed is busy: it would be
        left out of the answer); the timer's rounds (`_round`) do not."""
        if pod_id is None:
            await self.parts.verifier.checker.idle()
        return await self._round(pod_id, check=check)

    async def _round(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        return await shielded(self.parts.verifier.run(pod_id, check=check))

    async def upkeep(self, runtime_connected: bool) -> None:
        """The GC timer: GC while the runtime's pod list is current, retry failed attaches."""
        if self.parts.roster.synced and runtime_connected:
            await self.gc(reason="timer")
        if self.parts.roster.pending_repair() and self.parts.cfg.repair == "on":
            await self._round()

    async def verify_tick(self, runtime_connected: bool) -> None:
        """The verify timer: a round while the runtime's pod list is current."""
        if self.parts.roster.synced and runtime_connected:
            await self._round()

    async def reap(self) -> None:
        """Detach pods whose netns the runtime removed without telling us (containerd 2.1.9
        sends no NRI stop/remove for pods that lived through its restart, containerd#8426).
        Never a pod the runtime lists whose pause process runs: its path vanished, not the pod
        (verify reports it "netns-unreadable"; it is released when the runtime drops it)."""
        for pod_id in await self.parts.plan.reap_candidates():
            if self.parts.locks.busy(pod_id) or self.parts.roster.running(pod_id):
                continue
            async with self.parts.locks.pod(pod_id):
                reaped = await self.parts.plan.reap(pod_id)
            if reaped:
                self.parts.roster.removed(pod_id)  # stopped (or removed) without an event: nothing more to do

    async def recover(self) -> int:
        """Start-up, before anything serves: roll back every ADD a crash interrupted."""
        intents = self.parts.plan.interrupted()
        for intent in intents:
            async with self.parts.locks.pod(intent.pod_id):
                await self.parts.plan.recover(intent)
        return len(intents)

    def background(self) -> int:
        """Background tasks: GC and verify after a Synchronize, the CHECK of each pod a round queued."""
        return len(self._background) + self.parts.verifier.checker.pending()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
