"""The pod plan: what nri-cni does to one pod's networks, the same in every mode.

It is the verbs over (pod, its networks), each in a module of its own: attach.py (ADD,
FINALIZE, rollback on failure), detach.py (DEL, CHECK), rollback.py (undo an intent record,
doomed delete), upkeep.py (GC, the netns reaper, start-up recovery), oprecord.py (one log line
and one metric per operation). Who may run what when (per-pod locks, GC alone, tasks that
outlive a caller) is the pod service's (nri_cni/service/service.py): every method here that
changes a pod expects the caller to hold that pod's lock (or the exclusive one for GC).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nri_cni.cni import versions
from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.cni.nocache import NO_CACHE
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import NriCniError, PodError
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.node import NodeInspector
from nri_cni.pod.attach import Attacher
from nri_cni.pod.detach import Detacher, attach_order
from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.intents import Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import AttachRequest, PodInfo, PodNetworks, PrimaryNetwork, RuntimePrimary
from nri_cni.pod.oprecord import GcReport, OperationLog, OperationSink, OpRecord
from nri_cni.pod.repair import Repairer
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.seams import Readiness
from nri_cni.pod.select import Selected, select_networks
from nri_cni.pod.upkeep import Running, Upkeep, Valid

log = logging.getLogger("nri_cni.pod")

BARE_KEPT = 4096  # torn-down pods remembered as having nothing left (PodPlan._bare)


@dataclass
class Attached:
    """An attach's answer, and whether it attached anything new (a repeated one did not)."""

    networks: PodNetworks
    new: bool


class PodPlan:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        cni: CNIRuntime,
        *,
        intents: IntentStore,
        finalized: FinalizedMarks,
        sink: OperationSink,
        inspector: NodeInspector,
        readiness: Readiness | None = None,
        lifecycle: NetworkLifecycle | None = None,
    ) -> None:
        """The parts kept on disk (`intents`, `finalized`: under state_dir), the metrics
        (`sink`) and the pods' own netns pool (`inspector`: the answer's MAC and MTU) come from
        the composition root; `readiness` (status.refuse_when_not_ready) and
        `lifecycle` (INIT leases) are absent where nothing gates or leases (tools, benches)."""
        self.source = source = ConfigSource.of(cfg)
        self.cni = cni
        self.intents = intents
        self.oplog = OperationLog(sink)
        self.rollback = Rollback(cni, self.intents)
        self.finalized = finalized
        self.detacher = Detacher(cni, intents=self.intents, rollback=self.rollback, lifecycle=lifecycle)
        self.attacher = Attacher(
            source,
            cni,
            cni_uncached=cni.with_cache(NO_CACHE),
            intents=self.intents,
            rollback=self.rollback,
            finalized=self.finalized,
            inspector=inspector,
            readiness=readiness,
            lifecycle=lifecycle,
        )
        self.upkeep = Upkeep(source, cni, rollback=self.rollback, detacher=self.detacher, oplog=self.oplog)
        self.repairer = Repairer(cni, rollback=self.rollback, attacher=self.attacher, oplog=self.oplog)
        # pods whose last operation here was a detach that left nothing of them on disk (no
        # intent record, cache entry or FINALIZE mark; only this daemon writes them, and every
        # attach and repair takes its pod out first): a pod's teardown comes two to four
        # times (NRI stop and remove, the runtime's DELs), and the repeats need no disk look
        self._bare: dict[str, None] = {}

    @property
    def cfg(self) -> Config:
        """The config in force (a hot reload applies to the next ADD; cached pods keep theirs)."""
        return self.source.current

    # -- queries -----------------------------------------------------------------------------

    def cached(self, pod_id: str | None = None) -> list[CacheEntry]:
        return self.cni.cache.entries(container_id=pod_id)

    def cached_count(self) -> int:
        """How many entries the cache holds (their file names: nothing is read)."""
        return self.cni.cache.count()

    def attached_pod_ids(self) -> set[str]:
        return {e.container_id for e in self.cached()}

    def intent_pod_ids(self) -> list[str]:
        return self.intents.pod_ids()

    # -- repair (verify found a pod's networks differ) --------------------------------------

    async def repair(
        self,
        pod: PodInfo,
        *,
        selected: Sequence[Selected],
        damaged: Sequence[CacheEntry],
        ips: Mapping[tuple[str, str], tuple[str, ...]],
        wrong: Sequence[str],
        runtime_primary: RuntimePrimary | None = None,
    ) -> PodNetworks:
        """DEL what is damaged, ADD with the same IPs, FINALIZE (pod/repair.py, Repairer)."""
        self._bare.pop(pod.id, None)
        return await self.repairer.repair(
            pod, selected=selected, damaged=damaged, ips=ips, wrong=wrong, runtime_primary=runtime_primary
        )

    async def check_entry(self, entry: CacheEntry, netns: str) -> str:
        """CNI CHECK of one cached attachment: "" when it passes, else the plugin's error."""
        return await self.repairer.check_entry(entry, netns)

    # -- attach ------------------------------------------------------------------------------

    def select(self, pod: PodInfo, primary: PrimaryNetwork, request: AttachRequest) -> list[Selected]:
        """The pod's networks. A refused annotation is an operation too: it gets its log line
        and its metric. No lock needed: nothing is changed."""
        try:
            selected = select_networks(self.cfg, pod.namespace, pod.annotations, primary=primary)
            if pod.host_network:
                raise PodError(f"pod {pod.label()} has no network namespace (host network?)")
        except NriCniError as exc:
            record = OpRecord("add", pod)
            record.fail(exc)
            self.oplog.emit(record)
            raise
        if request.primary_ifname and selected and primary.ours:
            selected[0] = Selected(selected[0].network, request.primary_ifname, selected[0].capability_args)
        return selected

    def expected(self, pod: PodInfo, primary: PrimaryNetwork) -> list[Selected]:
        """The networks the pod should have by the current config and its annotation (verify):
        no record, nothing changed. Raises NriCniError when the config refuses the pod."""
        return select_networks(self.cfg, pod.namespace, pod.annotations, primary=primary)

    async def attach(
        self,
        pod: PodInfo,
        selected: list[Selected],
        request: AttachRequest,
        runtime_primary: RuntimePrimary | None = None,
    ) -> Attached:
        self._bare.pop(pod.id, None)
        record = OpRecord("add", pod)
        try:
            answer = await self.attacher.attach(pod, selected, request, record, runtime_primary)
            return Attached(answer, new=bool(record.networks))
        except NriCniError as exc:
            record.fail(exc)
            raise
        finally:
            if record.networks or record.error is not None:  # not for a pod attached already
                self.oplog.emit(record)

    # -- detach, check -----------------------------------------------------------------------

    async def detach(self, pod: PodInfo, op: str = "del", *, last: bool = False) -> None:
        """DEL every cached network of the pod (pod/detach.py). `last`: the runtime removes the
        pod (NRI RemovePodSandbox): nothing of it is remembered after (a later DEL looks)."""
        if pod.id in self._bare:
            if last:
                del self._bare[pod.id]
            log.debug("pod %s: %s found nothing to detach (torn down already)", pod.label(), op)
            return
        record = OpRecord(op, pod)
        self.finalized.forget(pod.id)
        errors = await self.detacher.detach(pod, record)
        for failure in errors:
            record.fail(failure.error)
        if errors:
            self.oplog.emit(record)
            raise PodError(
                f"pod {pod.label()}: DEL failed for {len(errors)} network(s): " + "; ".join(map(str, errors))
            )
        if not record.networks:  # NRI stop, NRI remove and the runtime's CNI DELs all arrive: no record
            log.debug("pod %s: %s found nothing to detach", pod.label(), op)
            return
        self.oplog.emit(record)
        if last:
            return
        self._bare[pod.id] = None  # this did the work: the other arrivals find nothing
        if len(self._bare) > BARE_KEPT:  # pods the runtime never removes: the oldest go
            del self._bare[next(iter(self._bare))]

    def fresh_add(self, pod: PodInfo, ifname: str, within: float) -> list[CacheEntry] | None:
        """The pod's cached attachments when a CHECK of (pod.id, pod.netns, `ifname`) comes
        right after their ADD: the pod's last recorded operation is an ADD that succeeded at
        most `within` seconds ago, of the same netns, and made exactly the attachments cached
        now, `ifname` among them, with no interrupted ADD left, every list 0.4.0 or later (below,
        CNI has no CHECK). None otherwise."""
        fresh = self.oplog.fresh.get(pod.id)
        if fresh is None or fresh.netns != pod.netns or self.oplog.clock() - fresh.ended > within:
            return None
        entries = self.cached(pod.id)
        keys = {e.key for e in entries}
        if keys != fresh.attachments or ifname not in {i for _, i in keys}:
            return None
        if any(e.netns != pod.netns or e.result is None for e in entries) or self.intents.load(pod.id):
            return None
        try:  # a list below 0.4.0 has no CHECK: the plugin path refuses it as CNI says
            if not all(versions.at_least(parse_conflist(e.config, source=e.path).cni_version, "0.4.0")
                       for e in entries):  # fmt: skip
                return None
        except NriCniError:
            return None
        return attach_order(entries)

    def checked_from_records(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> None:
        """The runtime's CHECK answered without a plugin run (PodService.check says when): a
        `check` record marked `"from": "records"`, each attachment's step, no plugin call."""
        record = OpRecord("check", pod, extra={"from": "records"})
        for entry in entries:
            record.step(entry.network_name, entry.ifname, "check")
        self.oplog.emit(record)

    async def check(self, pod: PodInfo) -> None:
        """The runtime's CHECK through the shim (CRI-O's right after each ADD, and of every pod
        at its start) that runs the plugins' CHECK: an operation of its own (`"from":
        "plugins"`), so its plugins' timings are not taken for the pod's next operation's."""
        record = OpRecord("check", pod, extra={"from": "plugins"})
        try:
            await self.detacher.check(pod, record)
        except NriCniError as exc:
            record.fail(exc)
            raise
        finally:
            if record.networks or record.error is not None:  # not when nothing of the pod's was checked
                self.oplog.emit(record)

    # -- upkeep ------------------------------------------------------------------------------

    async def collect_garbage(
        self, valid: Valid, locks: PodLocks | None = None, *, running: Running | None = None
    ) -> GcReport:
        if running is None:
            report = await self.upkeep.collect_garbage(valid, locks)
        else:
            report = await self.upkeep.collect_garbage(valid, locks, running=running)
        self.oplog.sink.observe_gc(report)
        self.finalized.drop_gone(valid)
        return report

    async def reap_candidates(self) -> list[str]:
        return await self.upkeep.reap_candidates()

    async def reap(self, pod_id: str) -> bool:
        return await self.upkeep.reap(pod_id)

    def interrupted(self) -> list[Intent]:
        """Start-up: the ADDs a crash interrupted (and the cache's leftovers go: temp files, deleted entries)."""
        self.upkeep.sweep_cache_leftovers()
        return self.intents.load_all()

    async def recover(self, intent: Intent) -> None:
        await self.upkeep.recover(intent)
