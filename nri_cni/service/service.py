"""The pod service: every pod operation enters here, whatever reached the daemon.

Entry points (NRI handlers, the local socket, the daemon's timers) translate their protocol
into these calls and nothing else. The service owns what makes operations safe together:

- per-pod serialization (nri_cni/pod/locks.py): operations on one pod never overlap,
  different pods run in parallel, GC DELs each stale pod under that pod's lock and runs only
  the plugins' GC verb alone (it waits for every operation in flight and holds back new ones);
- tasks of their own: a caller that gives up (an NRI request past its deadline) does not cancel
  plugins halfway; the work finishes and its state is kept (`_detached`);
- the pod roster (roster.py), updated under the pod's lock where GC must see it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import NriCniError
from nri_cni.node import NodeInspector
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import AttachRequest, PodInfo, PodNetworks
from nri_cni.pod.oprecord import GcReport
from nri_cni.pod.plan import PodPlan
from nri_cni.service.modes import Mode, mode_for
from nri_cni.service.podstate import BrokenCode, HealthBook, PodHealth, PodState
from nri_cni.service.roster import Roster
from nri_cni.service.snapshot import Rounds, ServiceSnapshot
from nri_cni.service.verify import Verifier

log = logging.getLogger("nri_cni.daemon")

T = TypeVar("T")

DEL_ACTION = (
    "find why in the plugin's error (a plugin binary missing or failing); once fixed, GC or the "
    "runtime's next stop releases it"
)
# a CHECK this soon after the pod's ADD (its end) is answered from the records when netlink
# agrees: CRI-O's comes right after the ADD; the bound keeps an old record from standing in for
# what only the plugins can tell (their own state) once time has passed
CHECK_FROM_RECORDS_WITHIN = 30.0
REMOVAL_GRACE = 3.0  # seconds a torn-down pod waits for its RemovePodSandbox before a new list is asked for


class PodService:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        *,
        plan: PodPlan,
        mode: Mode | None = None,
        roster: Roster | None = None,
        locks: PodLocks | None = None,
        health: HealthBook | None = None,
        inspector: NodeInspector | None = None,
    ) -> None:
        """`cfg`: the daemon's ConfigSource (a Config: a source of its own); `mode`: the mode
        made from it (default mode_for); `health`, `inspector`: the composition root's, which
        others read too (the metrics: pods by verdict)."""
        self.source = ConfigSource.of(cfg)
        if mode is not None:
            self.source.seed("mode", mode)
        self.plan = plan
        self.roster = roster or Roster()
        self.locks = locks or PodLocks()
        self.health = health or HealthBook()  # each pod's verdict from the last verify (podstate.py)
        self.verifier = Verifier(
            self.source,
            lambda: self.mode,
            plan=plan,
            roster=self.roster,
            locks=self.locks,
            health=self.health,
            inspector=inspector,
        )
        self._background: set[asyncio.Task[None]] = set()
        # set when the runtime tore a pod down (its CNI DEL, NRI stop) and no RemovePodSandbox
        # followed: containerd sends none for pods that lived through its restart
        # (containerd#8426), so only a new pod list can say the pod is gone (the daemon asks
        # for one by reconnecting; docs/reliability.md)
        self.roster_stale = asyncio.Event()
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def cfg(self) -> Config:
        """The config in force: a hot reload (ConfigSource.replace) applies to the next operation."""
        return self.source.current

    @property
    def mode(self) -> Mode:
        """The mode of the config in force (its primary_network may change on a reload): the
        one object the NRI handlers, the verifier and the service share."""
        return self.source.derived("mode", mode_for)

    async def close(self) -> None:
        """Stops the background work (GC and repair after a Synchronize)."""
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.verifier.close()

    # -- pod operations ----------------------------------------------------------------------

    async def attach(self, pod: PodInfo, request: AttachRequest | None = None) -> PodNetworks:
        return await _detached(self._attach(pod, request or AttachRequest()))

    async def _attach(self, pod: PodInfo, request: AttachRequest) -> PodNetworks:
        selected = self.plan.select(pod, self.mode.primary, request)
        async with self.locks.pod(pod.id):
            attached = await self.plan.attach(pod, selected, request, self.mode.runtime_primary(pod))
            if self.mode.answers_run_pod:
                self.roster.answered(pod.id, tuple(attached.networks.ips()))
            if attached.new:
                # Still under the pod's lock: a GC waiting for the exclusive lock computes its
                # valid pods after this, so a pod attached just now is never garbage.
                self.roster.attached(pod)
            return attached.networks

    async def detach(self, pod: PodInfo, *, stop_event: bool = False) -> None:
        """NRI StopPodSandbox (`stop_event`), the shim's DEL: the first does the work, the
        second finds nothing. A pod whose stop event came gets its remove event too."""
        lists = self.roster.lists
        if stop_event:
            self.roster.stop_announced(pod.id)
        await _detached(self._detach(pod, lists if stop_event else None))

    async def remove(self, pod: PodInfo) -> None:
        """NRI RemovePodSandbox: detach again if needed, then forget the pod (but for a DEL
        that failed: the pod stays reported, broken "del-failed", until GC's DEL succeeds).
        An event older than the runtime's newest pod list, which has the pod, changes nothing."""
        lists = self.roster.lists
        kept = False
        try:
            kept = not await _detached(self._detach(pod, lists))
        finally:
            if not kept:
                self.roster.removed(pod.id)
                self.verifier.forget(pod.id)
                if not self._del_failed(pod.id):
                    self.health.forget(pod.id)

    async def missed(self, pod: PodInfo, why: str) -> None:
        """Native mode: the RunPodSandbox answer for `pod` missed the runtime's deadline, so
        the runtime made the pod without it (no IP). Treated at once as a pod the runtime made
        without nri-cni: what was attached is released (never left behind the runtime's back)
        and the pod is reported broken "missed" by name, with `why`."""
        await _detached(self._missed(pod, why))

    async def _missed(self, pod: PodInfo, why: str) -> None:
        log.error("pod %s id=%s: %s", pod.label(), pod.id, why)
        async with self.locks.pod(pod.id):
            self.roster.missed(pod.id, why)
            try:
                await self.plan.detach(pod, op="missed")
            except NriCniError as exc:  # GC retries (the pod's attachments stay recorded)
                log.error("pod %s id=%s: releasing the late attach failed: %s", pod.label(), pod.id, exc)
        try:
            await self.verifier.run(pod.id)  # reports it "missed", by name
        except NriCniError:
            log.debug("pod %s: removed before its verdict", pod.id)  # no longer listed: nothing to report

    async def _detach(self, pod: PodInfo, lists: int | None = None) -> bool:
        """Detaches the pod; False (nothing done) for an NRI event older than the runtime's
        newest pod list when that list has the pod: containerd stopped in a RunPodSandbox sends
        its stop and remove, then, restarted, lists it READY with its IP (verify makes it true)."""
        async with self.locks.pod(pod.id):
            if lists is not None and self.roster.listed_since(pod.id, lists):
                log.warning(
                    "pod %s id=%s: its stop or remove came before the runtime's newest pod list, "
                    "which has it: kept",
                    pod.label(),
                    pod.id,
                )
                return False
            # under the lock: a verify waiting for it must see the runtime tore the pod down
            self.roster.stopped(pod.id)
            try:
                await self.plan.detach(pod)
            except NriCniError as exc:
                self._report_del_failed(pod.id, pod.label(), str(exc))
                raise
            if self._del_failed(pod.id):
                log.info(
                    "pod %s id=%s: its DEL succeeded; no longer broken (del-failed)", pod.label(), pod.id
                )
                self.health.forget(pod.id)
        if self.roster.pod(pod.id) is not None and not self.mode.answers_run_pod:
            # a timer, not a task: nothing waits for it, and `background()` stays what runs
            handle = asyncio.get_running_loop().call_later(REMOVAL_GRACE, self._removal_due, pod.id)
            self._timers.add(handle)
        return True

    def _never_broken(self, pod_id: str) -> bool:
        health = self.health.get(pod_id)
        return health is None or health.state is PodState.OK

    def _del_failed(self, pod_id: str) -> bool:
        health = self.health.get(pod_id)
        return health is not None and health.code is BrokenCode.DEL_FAILED

    def _report_del_failed(self, pod_id: str, label: str, error: str) -> None:
        """A DEL that fails is named, with its reason, in `nri-cni status` and `nri-cni pods`
        (once in the log as it starts failing); GC retries it while the runtime does not list
        the pod, the runtime's stop retries it while it does."""
        reason = f"its DEL fails, so nri-cni still holds its networks: {error}; {DEL_ACTION}"
        self.health.broken(pod_id, BrokenCode.DEL_FAILED, reason, label=label)

    def _removal_due(self, pod_id: str) -> None:
        """The runtime tore the pod down (the shim's DEL) and sent no NRI stop for it within
        REMOVAL_GRACE: a pod restored by a runtime restart, whose RemovePodSandbox will not
        come either; the roster is stale. (A pod the runtime sends events for gets its stop
        before the DEL on containerd, shortly after it on CRI-O, and its remove later, whenever
        the kubelet removes the sandbox.) Not in native mode: reconnecting there makes pods
        created meanwhile miss nri-cni's answer."""
        self._timers = {
            h for h in self._timers if not h.cancelled() and h.when() > asyncio.get_running_loop().time()
        }
        if self.roster.removal_overdue(pod_id):
            self.roster_stale.set()

    async def check(self, pod: PodInfo, ifname: str = "eth0") -> None:
        """The runtime's CNI CHECK through the shim (CRI-O's right after each ADD). Answered from
        the records, without a plugin run, when it comes at most CHECK_FROM_RECORDS_WITHIN after
        a successful ADD that is the pod's last operation, of the same container id, netns and
        ifname, the pod is not stopped or broken, and netlink shows every attachment as its
        result says; otherwise every network's CNI CHECK runs on its cached result
        (docs/reliability.md, "CHECK after ADD")."""
        async with self.locks.pod(pod.id):
            entries = self.plan.fresh_add(pod, ifname, CHECK_FROM_RECORDS_WITHIN)
            if (
                entries is not None
                and not self.roster.record(pod.id).stopped
                and self._never_broken(pod.id)
                and await self.verifier.node_shows(pod, entries)
            ):
                self.plan.checked_from_records(pod, entries)
                return
            await self.plan.check(pod)

    def seen(self, pod: PodInfo) -> None:
        self.roster.seen(pod)

    def needs_repair(self, pod: PodInfo) -> None:
        self.roster.attach_failed(pod.id)

    # -- the runtime's pod list, GC, repair, reaper, recovery --------------------------------

    def synchronized(self, pods: list[PodInfo]) -> None:
        """The runtime's full pod list (every (re)connection). Returns at once: GC and repair
        run afterwards, in the background, so Synchronize never outlives the runtime's timeout."""
        self.roster.listed(pods)
        self._prune()
        log.info("synchronized: the runtime has %d pod(s)", len(pods))
        self._spawn(self._after_sync(), "after-sync")

    async def _after_sync(self) -> None:
        try:
            await self.gc(reason="synchronize")
        finally:  # a GC that failed still leaves the pods to verify
            if self.cfg.repair_on_sync and self.cfg.repair != "off":
                await self.verify()

    async def gc(self, reason: str) -> GcReport:
        """GC against the roster's valid pods; refused before the runtime's first pod list."""
        if not self.roster.synced:
            raise NriCniError(
                "no pod list from the runtime yet (not synchronized): GC would delete every attachment"
            )
        log.info("gc (%s): %d pod(s) listed by the runtime", reason, len(self.roster.pods()))
        # asked again under each stale pod's lock: a pod attached (or listed) meanwhile is valid
        grace = self.cfg.gc_unlisted_grace
        report = await self._collect(lambda: self.roster.valid_pod_ids(self.in_flight(), grace))
        attached = self.plan.attached_pod_ids()
        # a pod attached again after GC DELed it (an ADD during this GC) keeps its grace
        deleted = [name for name in report["deleted"] if name.split("/")[1] not in attached]
        self.roster.collected(deleted, attached, grace)
        self._gc_outcome(report, attached)
        self._prune()
        return report

    def _gc_outcome(self, report: GcReport, attached: set[str]) -> None:
        """A pod whose DEL failed is forgotten once nothing of it is held; an unlisted pod whose
        DEL fails in GC is reported by name (del-failed), not retried silently for ever."""
        held = attached | set(self.plan.intent_pod_ids())
        for health in self.health.broken_pods():
            if health.code is BrokenCode.DEL_FAILED and health.pod_id not in held:
                log.info("pod id=%s: GC released what it held; no longer broken (del-failed)", health.pod_id)
                self.health.forget(health.pod_id)
        for pod_id in held - set(self.roster.pods()):
            errors = [e for e in report["errors"] if pod_id in e]
            if errors:
                self._report_del_failed(pod_id, pod_id[:12], "; ".join(errors))

    def _prune(self) -> None:
        """The runtime's list is the roster: verdicts and repair retries of pods it does not
        list (a RemovePodSandbox lost while the connection was down) go; what nri-cni still
        holds of them (cache entries, intent records) stays until GC has released it."""
        listed = set(self.roster.pods())
        # a pod whose DEL fails stays named (del-failed) until GC has released what it holds
        held = {h.pod_id for h in self.health.broken_pods() if h.code is BrokenCode.DEL_FAILED}
        self.health.retain(listed | held)
        self.verifier.retain(listed)

    async def gc_listed(self, pod_ids: set[str]) -> GcReport:
        """The runtime's own GC of the shim's network: its valid attachments are its pods."""
        grace = self.cfg.gc_unlisted_grace
        return await self._collect(lambda: pod_ids | self.in_flight() | self.roster.unconfirmed_valid(grace))

    async def _collect(self, valid: Callable[[], set[str]]) -> GcReport:
        # The stale pods' DELs each take their pod's lock, the GC verb the exclusive one
        # (Upkeep.collect_garbage): a pod ADD meanwhile waits for nothing but its own pod.
        return await self.plan.collect_garbage(valid, self.locks, running=self.roster.running)

    async def verify(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        """One verify round (app/verify.py): every pod the runtime lists running with a netns,
        or only `pod_id` (NriCniError when the runtime does not list it); `check` forces CNI
        CHECK of every attachment verified. Verdicts go to `self.health`, what differs is
        repaired per `repair`; each pod's part runs under its lock. Returns the verdicts."""
        return await _detached(self.verifier.run(pod_id, check=check))

    async def repair(self) -> None:
        """A verify round, which repairs per `repair` (the name of the pre-verify entry point)."""
        await self.verify()

    async def upkeep(self, runtime_connected: bool) -> None:
        """The GC timer: GC while the runtime's pod list is current, retry failed attaches."""
        if self.roster.synced and runtime_connected:
            await self.gc(reason="timer")
        if self.roster.pending_repair() and self.cfg.repair == "on":
            await self.verify()

    async def verify_tick(self, runtime_connected: bool) -> None:
        """The verify timer: a round while the runtime's pod list is current."""
        if self.roster.synced and runtime_connected:
            await self.verify()

    async def reap(self) -> None:
        """Detach pods whose netns the runtime removed without telling us (containerd 2.1.9
        sends no NRI stop/remove for pods that lived through its restart, containerd#8426).
        Never a pod the runtime lists whose pause process runs: its path vanished, not the pod
        (verify reports it "netns-unreadable"; it is released when the runtime drops it)."""
        for pod_id in self.plan.reap_candidates():
            if self.locks.busy(pod_id) or self.roster.running(pod_id):
                continue
            async with self.locks.pod(pod_id):
                reaped = await self.plan.reap(pod_id)
            if reaped:
                self.roster.removed(pod_id)  # stopped (or removed) without an event: nothing more to do

    async def recover(self) -> int:
        """Start-up, before anything serves: roll back every ADD a crash interrupted."""
        intents = self.plan.interrupted()
        for intent in intents:
            async with self.locks.pod(intent.pod_id):
                await self.plan.recover(intent)
        return len(intents)

    # -- queries -----------------------------------------------------------------------------

    def snapshot(self, *, attachments: bool = True, runtime_attachments: bool = False) -> ServiceSnapshot:
        """What the reports show, taken at once. The caches are read only when asked for:
        `attachments` (nri-cni's own), `runtime_attachments` (the runtime's, secondary mode);
        the count of nri-cni's entries always (their names, no file opened)."""
        book = self.health
        held = tuple(self.attachments()) if attachments else ()
        return ServiceSnapshot(
            cfg=self.cfg,
            mode=self.mode.name,
            listed=self.roster.pods(),
            pending_repair=self.roster.pending_repair(),
            pending_rollback=tuple(self.pending_rollbacks()),
            unconfirmed=self.roster.unconfirmed_count(),
            operations=len(self.locks),
            background=self.background(),
            verdicts=tuple(book.all()),
            counts=book.counts(),
            rounds=Rounds(book.rounds, book.last_round, book.last_round_seconds),
            attachments=held,
            attachment_count=len(held) if attachments else self.plan.cached_count(),
            runtime_attachments=tuple(self.mode.runtime_attachments()) if runtime_attachments else (),
        )

    def busy(self, pod_id: str) -> bool:
        return self.locks.busy(pod_id)

    def in_flight(self) -> set[str]:
        return self.locks.pod_ids()

    def attachments(self, pod_id: str | None = None) -> list[CacheEntry]:
        return self.plan.cached(pod_id)

    def pending_rollbacks(self) -> list[str]:
        """Pods with an intent record and no operation in flight: a rollback waiting to be
        retried (or, for an instant, an ADD about to take its lock)."""
        return [p for p in self.plan.intent_pod_ids() if not self.locks.busy(p)]

    def background(self) -> int:
        return len(self._background)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _detached(coro: Awaitable[T]) -> T:
    # shield: the operation finishes even if the caller is cancelled (NRI deadline).
    return await asyncio.shield(asyncio.ensure_future(coro))
