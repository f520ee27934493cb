"""The per-pod verbs of the pod service: every event that reaches one pod (NRI pod events, the
shim's ADD, DEL and CHECK), each under that pod's lock (nri_cni/pod/locks.py), in a task of its
own: a caller that gives up (an NRI request past its deadline) does not cancel plugins halfway;
the work finishes and its state is kept (`shielded`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from nri_cni.errors import NriCniError
from nri_cni.pod.model import AttachRequest, PodInfo, PodNetworks
from nri_cni.service.parts import ServiceParts
from nri_cni.service.podcheck import node_shows
from nri_cni.service.podstate import PodState

log = logging.getLogger("nri_cni.daemon")

T = TypeVar("T")

# a CHECK this soon after the pod's ADD (its end) is answered from the records when netlink
# agrees: CRI-O's comes right after the ADD; the bound keeps an old record from standing in for
# what only the plugins can tell (their own state) once time has passed
CHECK_FROM_RECORDS_WITHIN = 30.0
REMOVAL_GRACE = 3.0  # seconds a torn-down pod waits for its RemovePodSandbox before a new list is asked for


class PodVerbs:
    def __init__(self, parts: ServiceParts) -> None:
        self.parts = parts
        # set when the runtime tore a pod down (its CNI DEL, NRI stop) and no RemovePodSandbox
        # followed: containerd sends none for pods that lived through its restart
        # (containerd#8426), so only a new pod list can say the pod is gone (the daemon asks
        # for one by reconnecting; docs/reliability.md)
        self.roster_stale = asyncio.Event()
        self._removals: set[asyncio.TimerHandle] = set()

    def close(self) -> None:
        """Cancels the removal timers."""
        for handle in self._removals:
            handle.cancel()
        self._removals.clear()

    async def attach(self, pod: PodInfo, request: AttachRequest | None = None) -> PodNetworks:
        return await shielded(self._attach(pod, request or AttachRequest()))

    async def _attach(self, pod: PodInfo, request: AttachRequest) -> PodNetworks:
        selected = self.parts.plan.select(pod, self.parts.mode.primary, request)
        async with self.parts.locks.pod(pod.id):
            attached = await self.parts.plan.attach(pod, selected, request, self.parts.mode.runtime_primary)
            if self.parts.mode.answers_run_pod:
                self.parts.roster.answered(pod.id, tuple(attached.networks.ips()))
            if attached.new:
                # Still under the pod's lock: a GC waiting for the exclusive lock computes its
                # valid pods after this, so a pod attached just now is never garbage.
                self.parts.roster.attached(pod)
            return attached.networks

    async def detach(self, pod: PodInfo, *, stop_event: bool = False) -> None:
        """NRI StopPodSandbox (`stop_event`), the shim's DEL: the first does the work, the
        second finds nothing. A pod whose stop event came gets its remove event too."""
        lists = self.parts.roster.lists
        if stop_event:
            self.parts.roster.stop_announced(pod.id)
        await shielded(self._detach(pod, lists if stop_event else None))

    async def remove(self, pod: PodInfo) -> None:
        """NRI RemovePodSandbox: detach again if needed, then forget the pod (but for a DEL
        that failed: the pod stays reported, broken "del-failed", until GC's DEL succeeds).
        An event older than the runtime's newest pod list, which has the pod, changes nothing."""
        lists = self.parts.roster.lists
        kept = False
        try:
            kept = not await shielded(self._detach(pod, lists, removing=True))
        finally:
            if not kept:
                self.parts.roster.removed(pod.id)
                self.parts.verifier.forget(pod.id)
                if not self.parts.health.fails_del(pod.id):
                    self.parts.health.forget(pod.id)

    async def missed(self, pod: PodInfo, why: str) -> None:
        """Native mode: the RunPodSandbox answer for `pod` missed the runtime's deadline, so
        the runtime made the pod without it (no IP). Treated at once as a pod the runtime made
        without nri-cni: what was attached is released (never left behind the runtime's back)
        and the pod is reported broken "missed" by name, with `why`."""
        await shielded(self._missed(pod, why))

    async def _missed(self, pod: PodInfo, why: str) -> None:
        log.error("pod %s id=%s: %s", pod.label(), pod.id, why)
        async with self.parts.locks.pod(pod.id):
            self.parts.roster.missed(pod.id, why)
            try:
                await self.parts.plan.detach(pod, op="missed")
            except NriCniError as exc:  # GC retries (the pod's attachments stay recorded)
                log.error("pod %s id=%s: releasing the late attach failed: %s", pod.label(), pod.id, exc)
        try:
            await self.parts.verifier.run(pod.id)  # reports it "missed", by name
        except NriCniError:
            log.debug("pod %s: removed before its verdict", pod.id)  # no longer listed: nothing to report

    async def _detach(self, pod: PodInfo, lists: int | None = None, *, removing: bool = False) -> bool:
        """Detaches the pod; False (nothing done) for an NRI event older than the runtime's
        newest pod list when that list has the pod: containerd stopped in a RunPodSandbox sends
        its stop and remove, then, restarted, lists it READY with its IP (verify makes it true).
        A teardown but for RemovePodSandbox's (`removing`: the pod is forgotten next) waits
        REMOVAL_GRACE for the pod's NRI stop (`_removal_due`)."""
        async with self.parts.locks.pod(pod.id):
            if lists is not None and self.parts.roster.listed_since(pod.id, lists):
                log.warning(
                    "pod %s id=%s: its stop or remove came before the runtime's newest pod list, "
                    "which has it: kept",
                    pod.label(),
                    pod.id,
                )
                return False
            # under the lock: a verify waiting for it must see the runtime tore the pod down
            self.parts.roster.stopped(pod.id)
            try:
                await self.parts.plan.detach(pod, last=removing)
            except NriCniError as exc:
                self.parts.health.del_failed(pod.id, str(exc), label=pod.label())
                raise
            if self.parts.health.fails_del(pod.id):
                log.info(
                    "pod %s id=%s: its DEL succeeded; no longer broken (del-failed)", pod.label(), pod.id
                )
                self.parts.health.forget(pod.id)
        if (
            not removing
            and self.parts.roster.record(pod.id).pod is not None
            and not self.parts.mode.answers_run_pod
        ):
            # a timer, not a task: nothing waits for it, and the background count stays what runs
            handle = asyncio.get_running_loop().call_later(REMOVAL_GRACE, self._removal_due, pod.id)
            self._removals.add(handle)
        return True

    def _never_broken(self, pod_id: str) -> bool:
        health = self.parts.health.get(pod_id)
        return health is None or health.state is PodState.OK

    def _removal_due(self, pod_id: str) -> None:
        """The runtime tore the pod down (the shim's DEL) and sent no NRI stop for it within
        REMOVAL_GRACE: a pod restored by a runtime restart, whose RemovePodSandbox will not
        come either; the roster is stale. (A pod the runtime sends events for gets its stop
        before the DEL on containerd, shortly after it on CRI-O, and its remove later, whenever
        the kubelet removes the sandbox.) Not in native mode: reconnecting there makes pods
        created meanwhile miss nri-cni's answer."""
        self._removals = {
            h for h in self._removals if not h.cancelled() and h.when() > asyncio.get_running_loop().time()
        }
        if self.parts.roster.record(pod_id).removal_overdue:
            self.roster_stale.set()

    async def check(self, pod: PodInfo, ifname: str = "eth0") -> None:
        """The runtime's CNI CHECK through the shim (CRI-O's right after each ADD). Answered from
        the records, without a plugin run, when it comes at most CHECK_FROM_RECORDS_WITHIN after
        a successful ADD that is the pod's last operation, of the same container id, netns and
        ifname, the pod is not stopped or broken, and netlink shows every attachment as its
        result says; otherwise every network's CNI CHECK runs on its cached result
        (docs/reliability.md, "CHECK after ADD")."""
        async with self.parts.locks.pod(pod.id):
            entries = self.parts.plan.fresh_add(pod, ifname, CHECK_FROM_RECORDS_WITHIN)
            if (
                entries is not None
                and not self.parts.roster.record(pod.id).stopped
                and self._never_broken(pod.id)
                and await node_shows(self.parts.verifier.pod_inspector, pod, entries)
            ):
                self.parts.plan.checked_from_records(pod, entries)
                return
            await self.parts.plan.check(pod)

    def seen(self, pod: PodInfo) -> None:
        self.parts.roster.seen(pod)

    def attach_failed(self, pod: PodInfo) -> None:
        """Its attach failed and the runtime keeps the pod (failure_policy keep): verify retries it."""
        self.parts.roster.attach_failed(pod.id)


async def shielded(coro: Awaitable[T]) -> T:
    # shield: the operation finishes even if the caller is cancelled (NRI deadline).
    return await asyncio.shield(asyncio.ensure_future(coro))
