"""attach: the ADD of one pod's networks, under the pod's lock (the pod service holds it).

Select the pod's networks, write the intent record, ADD each network in order, then FINALIZE
each network in the same order (its own `finalize_plugins`, then the `_finalize.d/` drop-ins),
fill in MAC/MTU the plugins did not report, clear the intent. A failure at network k deletes
networks k..0 in reverse (the spec wants a DEL after every ADD, failed ones included) and
reports an error naming the network and the plugin.

Secondary mode: the runtime's own primary (eth0) gets its FINALIZE first, once per pod
(finalized.py), also when the pod has no network of nri-cni's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import NetworkConfigList, PluginConf, finalize_dir_plugins, parse_conflist
from nri_cni.cni.prev_result import conf_of
from nri_cni.cni.result import Result
from nri_cni.cni.result_parse import parse_result
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import CniCode, CNIError, NriCniError, PluginRef, PodError
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.lifecycle.spec import is_managed
from nri_cni.node import NodeInspector, netlink
from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.model import AttachRequest, Key, NetworkAttachment, PodInfo, PodNetworks, RuntimePrimary
from nri_cni.pod.oprecord import NetworkFailure, OpRecord
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.seams import Readiness
from nri_cni.pod.select import Selected

log = logging.getLogger("nri_cni.pod")


class Attacher:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        cni: CNIRuntime,
        *,
        cni_uncached: CNIRuntime,
        intents: IntentStore,
        rollback: Rollback,
        finalized: FinalizedMarks,
        inspector: NodeInspector,
        readiness: Readiness | None = None,
        lifecycle: NetworkLifecycle | None = None,
    ) -> None:
        self.source = ConfigSource.of(cfg)
        self.inspector = inspector  # the pods' own netns pool: the answer's MAC and MTU
        self.finalized = finalized  # the pods whose runtime primary had its FINALIZE
        self.cni = cni
        # FINALIZE of the runtime's own primary: the runtime's attachment, never in our cache
        self.cni_uncached = cni_uncached
        self.intents = intents
        self.rollback = rollback
        self.readiness = readiness
        # INIT / DEINIT per network generation: ADDs hold a lease on their generation
        self.lifecycle = lifecycle
        # every pod's ADDs on the node together (limits.parallel_per_node, read at start-up)
        self.node_slots = asyncio.Semaphore(self.cfg.limits.parallel_per_node)

    @property
    def cfg(self) -> Config:
        return self.source.current

    @property
    def finalize_dropins(self) -> tuple[PluginConf, ...]:
        """The `_finalize.d` plugins of the config in force, read once per config."""
        return self.source.derived("finalize_dropins", _dropins_of)

    async def attach(
        self,
        pod: PodInfo,
        selected: list[Selected],
        request: AttachRequest,
        record: OpRecord,
        runtime_primary: RuntimePrimary | None,
    ) -> PodNetworks:
        await self._undo_abandoned(pod, record)
        async with self._leases(pod, selected):  # waits for INIT
            return await self._attach(pod, selected, request, record, runtime_primary)

    def _leases(self, pod: PodInfo, selected: list[Selected]) -> AbstractAsyncContextManager[None]:
        """Leases on the generations this ADD will use (docs/lifecycle.md): INIT has run
        before the first ADD, fails the pod with INIT's error, and no DEINIT starts meanwhile."""
        managed = [s for s in selected if is_managed(s.network.conflist)]
        if self.lifecycle is None or not managed:
            return contextlib.nullcontext()
        existing = {e.key for e in self.cni.cache.entries(container_id=pod.id)}
        return self.lifecycle.leases(
            s.network.conflist for s in managed if (s.network.name, s.ifname) not in existing
        )

    async def _undo_abandoned(self, pod: PodInfo, record: OpRecord) -> None:
        """An intent record found under the pod's lock belongs to an ADD nobody is running any
        more (its rollback failed, or a crash): finish that rollback before a new ADD."""
        intent = self.intents.load(pod.id)
        if intent is None:
            return
        errors = await self.rollback.undo(intent, record, netns=pod.netns)
        if errors:
            raise PodError(
                f"pod {pod.label()}: an earlier failed ADD still cannot be rolled back: "
                + "; ".join(map(str, errors)),
                network=intent.networks[-1].network,
            )

    async def _attach(
        self,
        pod: PodInfo,
        selected: list[Selected],
        request: AttachRequest,
        record: OpRecord,
        runtime_primary: RuntimePrimary | None,
    ) -> PodNetworks:
        # the entries this pod's networks would have, read by name: no listing of every pod's
        existing = {
            s.key: e
            for s in selected
            if (e := self.cni.cache.read(s.network.name, pod.id, s.ifname)) is not None
        }
        results = {key: parse_result(e.result or {"cniVersion": "1.1.0"}) for key, e in existing.items()}
        todo = [s for s in selected if s.key not in existing]
        if not todo:
            # Already attached (repeated RunPodSandbox, or NRI Run after the shim's ADD), or
            # nothing of nri-cni's to attach (secondary mode, a pod with eth0 only).
            try:
                await self._finalize_primary(pod, self._unfinalized_primary(pod, runtime_primary), record)
            except NriCniError as exc:
                raise pod_error(pod, exc) from exc
            return _answer(pod, selected, results)
        await self._check_ready(todo)
        confs = _runtime_confs(pod, selected, request)
        intent = _intent(pod, todo, confs)
        # Written (atomic) before any plugin runs, a failure here leaves nothing; durable before
        # it is cleared: its fsync (a journal commit, ~1 ms) runs while the plugins, FINALIZE
        # and the netlink fill work. A crash of the daemon finds the record (the page cache
        # survives a kill); journalling file systems (ext4, XFS) commit it no later than what the
        # plugins write after it.
        self.intents.write(intent, durable=False)
        record.mark("intent written")
        synced = asyncio.ensure_future(self.intents.sync(pod.id))
        synced.add_done_callback(_retrieved)  # cancelled meanwhile: its error is nobody's
        adds = Adds()
        try:
            adds = await self._add_all(todo, confs, intent, record)
            if adds.failure is not None:
                raise adds.failure
            results.update(adds.results)
            await self._finalize_all(pod, selected, confs, results, record, runtime_primary, request)
            await synced
            record.mark("intent synced")
        except NriCniError as exc:
            await _settled(synced)
            # DEL what was started, last first; the record of the rest goes (never ADDed)
            errors = await self.rollback.undo(Intent(pod.id, pod.netns, adds.started), record, op="rollback")
            raise pod_error(pod, exc, errors) from exc
        # Cancelled or crashed mid-way (any other exception): the intent record stays for
        # start-up recovery.
        self.intents.clear(pod.id)
        record.mark("intent cleared")
        return _answer(pod, selected, results)

    async def _add_all(self, todo: list[Selected], confs: Confs, intent: Intent, record: OpRecord) -> Adds:
        """ADD the networks at once, each chain in its order (go-cni's way; limits.parallel_per_pod
        of one pod together, limits.parallel_per_node on the node). A network that fails stops
        the ones not started yet; those running finish (a plugin is never cut halfway). The
        answer names every network started (for the rollback) and the first failure; anything
        but a plugin's failure (cancelled, a bug) is raised: the intent stays."""
        adds = Adds()
        planned = {(n.network, n.ifname): n for n in intent.networks}
        pod_slots = asyncio.Semaphore(self.cfg.limits.parallel_per_pod)

        async def one(sel: Selected) -> None:
            async with pod_slots, self.node_slots:
                if adds.failure is not None:
                    return  # another network failed: this one is not started
                net, rt = confs[sel.key]
                t0 = time.perf_counter()
                adds.started.append(planned[sel.key])
                try:
                    adds.results[sel.key] = await self._add_one(net, rt, record)
                except NriCniError as exc:
                    adds.failure = adds.failure or exc
                    self.rollback.record_doomed(intent, planned[sel.key], net, rt, exc)
                    return
                record.step(net.name, sel.ifname, "add", t0)

        if len(todo) == 1:
            await one(todo[0])  # the common case: no task
        else:
            outcomes = await asyncio.gather(*(one(sel) for sel in todo), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        return adds

    async def _check_ready(self, todo: list[Selected]) -> None:
        """status.refuse_when_not_ready: no ADD of a network whose STATUS fails."""
        if not self.cfg.refuse_when_not_ready or self.readiness is None:
            return
        for sel in todo:
            error = await self.readiness.ready(sel.network.name)
            if error:
                raise CNIError(
                    CniCode.PLUGIN_NOT_AVAILABLE,
                    f"network {sel.network.name!r} is not ready (STATUS failed)",
                    details=error,
                    ref=PluginRef(network=sel.network.name, command="STATUS"),
                )

    async def _add_one(self, net: NetworkConfigList, rt: RuntimeConf, record: OpRecord) -> Result:
        try:
            return await self.cni.add(net, rt, observe=record)
        except CNIError as exc:
            if not exc.ref.network:
                exc.ref = type(exc.ref)(network=net.name, plugin=exc.ref.plugin, command="ADD")
            raise

    async def _finalize_all(
        self,
        pod: PodInfo,
        selected: list[Selected],
        confs: Confs,
        results: dict[Key, Result],
        record: OpRecord,
        runtime_primary: RuntimePrimary | None,
        request: AttachRequest,
    ) -> None:
        await self._finalize_primary(pod, self._unfinalized_primary(pod, runtime_primary), record)
        nets = [(sel.key, *confs[sel.key]) for sel in selected]
        extra = self.finalize_dropins
        for key, net, rt in nets:
            if not net.finalize_plugins and not extra:
                continue
            t0 = time.perf_counter()
            # finalize() caches a result a plugin changed, so that a later DEL sees it
            results[key] = await self.cni.finalize(net, rt, results[key], extra, observe=record)
            record.step(net.name, rt.ifname, "finalize", t0)
        record.mark("finalized")
        if runtime_primary is not None:
            # Secondary mode: the runtime never sees these results (its answer is its own
            # network's), so the MAC/MTU a plugin left out is not worth a netns visit here.
            return
        # a netns visit each (~0.3-1.5 ms on the pod's path): only for the results answered
        for key, _net, rt in nets[:1] if request.first_answered else nets:
            results[key] = await netlink.fill_interface_details(
                self.inspector.interface_details, rt.netns, results[key]
            )
        record.mark("filled")

    def _unfinalized_primary(
        self, pod: PodInfo, primary: RuntimePrimary | None
    ) -> tuple[NetworkConfigList, RuntimeConf, Result] | None:
        """The runtime's own network unless its FINALIZE ran for this pod already."""
        if primary is None or self.finalized.done(pod.id):
            return None
        return _primary_conf(pod, primary)

    async def _finalize_primary(
        self, pod: PodInfo, primary: tuple[NetworkConfigList, RuntimeConf, Result] | None, record: OpRecord
    ) -> None:
        """The runtime's own primary: its FINALIZE once per pod. Its result is the runtime's
        attachment, never one of nri-cni's: nothing is cached (cni_uncached)."""
        if primary is None:
            return
        net, rt, result = primary
        if not net.finalize_plugins and not self.finalize_dropins:
            return
        t0 = time.perf_counter()
        await self.cni_uncached.finalize(net, rt, result, self.finalize_dropins, observe=record)
        record.step(net.name, rt.ifname, "finalize", t0)
        self.finalized.mark(pod.id, rt.netns)


Confs = dict[Key, tuple[NetworkConfigList, RuntimeConf]]  # each network's list and its ADD's runtime conf


@dataclass
class Adds:
    """What the ADDs of one attach did: every network started (in order), the results of those
    that succeeded, the first failure."""

    started: list[IntendedNetwork] = field(default_factory=list)
    results: dict[Key, Result] = field(default_factory=dict)
    failure: NriCniError | None = None


def _runtime_confs(pod: PodInfo, selected: list[Selected], request: AttachRequest) -> Confs:
    confs: Confs = {}
    for index, sel in enumerate(selected):
        caps = dict(sel.capability_args)
        if index == 0:
            caps = {**request.runtime_caps, **caps}  # port mappings, bandwidth... go to the primary
        rt = RuntimeConf(
            container_id=pod.id,
            netns=pod.netns,
            ifname=sel.ifname,
            args=pod.cni_args(),
            capability_args=caps,
            # ADD's alone: the intent record and the cache keep args and caps without it
            ip_request=tuple(request.ips.get(sel.key) or ()),
        )
        confs[sel.key] = (sel.network.conflist, rt)
    return confs


def _intent(pod: PodInfo, todo: list[Selected], confs: Confs) -> Intent:
    """The record of the ADDs about to run (pod/intents.py): what a rollback or recovery DELs."""
    networks = []
    for sel in todo:
        net, rt = confs[sel.key]
        networks.append(IntendedNetwork(sel.network.name, sel.ifname, net.bytes, rt.args, rt.capability_args))
    return Intent(pod.id, pod.netns, networks)


def _answer(pod: PodInfo, selected: list[Selected], results: dict[Key, Result]) -> PodNetworks:
    answer = PodNetworks(pod)
    for sel in selected:
        answer.attachments.append(NetworkAttachment(sel.network.name, sel.ifname, results[sel.key]))
    return answer


def _primary_conf(
    pod: PodInfo, primary: RuntimePrimary
) -> tuple[NetworkConfigList, RuntimeConf, Result] | None:
    """Secondary mode: the runtime's own network, from the runtime's libcni cache entry."""
    entry: CacheEntry | None = primary.entry(pod.id)
    if entry is None or entry.result is None:
        log.warning(
            "pod %s: no cached result of the runtime's network %r; FINALIZE skips it",
            pod.label(),
            primary.network,
        )
        return None
    net = parse_conflist(entry.config, source=entry.path)
    return net, conf_of(entry, pod.netns or entry.netns), parse_result(entry.result)


async def _settled(task: asyncio.Future[None]) -> None:
    """After a failed ADD: the intent's fsync is finished before the rollback rewrites or
    clears the record; its own error is moot then."""
    await asyncio.wait([task])


def _dropins_of(cfg: Config) -> tuple[PluginConf, ...]:
    plugins, errors = finalize_dir_plugins(cfg.cni.finalize_dir, trust=cfg.trust_files)
    for err in errors:
        log.error("finalize drop-in skipped: %s", err)
    return plugins


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def pod_error(pod: PodInfo, exc: NriCniError, rollback_errors: Sequence[NetworkFailure] = ()) -> PodError:
    where = ""
    if rollback_errors:
        where += (
            f"; undoing it failed too, retried later ({len(rollback_errors)} network(s): "
            + "; ".join(map(str, rollback_errors))
            + ")"
        )
    return PodError(
        f"pod {pod.label()}: networking failed{where}",
        cause=exc,
        network=exc.ref.network if isinstance(exc, CNIError) else "",
    )
