"""The pod plan: the same in every mode (NRI-native, shim, secondary).

attach: select the pod's networks, write the intent record, ADD each network in order, then
FINALIZE each network in the same order (its own `finalize_plugins`, then the `_finalize.d/`
drop-ins), fill in MAC/MTU the plugins did not report, clear the intent. A failure at network k
deletes networks k..0 in reverse (the spec wants a DEL after every ADD, failed ones included) and
reports an error naming the network and the plugin.

detach: DEL every cached network of the pod in reverse, from the cache (never from the current
config: a reload between ADD and DEL must not change what DEL sees). Idempotent, so the first of
NRI StopPodSandbox and the runtime's CNI DEL does the work and the second finds nothing.

Every pod operation runs under the pod's lock; GC runs under the exclusive lock (locks.py).
Pod operations run as tasks of their own: a caller that gives up (an NRI request past its
deadline) does not cancel plugins halfway; the work finishes and its state is kept.

Nothing leaks (docs/reliability.md): what a pod holds is either a cache entry (a finished
attachment) or an intent record (an ADD that did not finish, or whose rollback failed). GC,
the pod's DEL and start-up recovery work through both, until every DEL succeeded. A plugin
whose ADD failed with an error meaning "nothing was created" (`nothing_created`) is recorded
as doomed for that attachment: its DEL still runs, but its DEL failure neither stops the DEL
of the plugins before it nor counts as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import NetworkConfigList, PluginConf, load_finalize_dropins, parse_conflist
from nri_cni.cni.result import Result, parse_result
from nri_cni.cni.runtime import Attachment, CNIRuntime, RuntimeConf
from nri_cni.config import Config
from nri_cni.errors import CniCode, CNIError, NriCniError, PluginExecError, PluginRef, PluginTimeout, PodError
from nri_cni.fsutil import is_temporary
from nri_cni.lifecycle.spec import is_managed
from nri_cni.pod import netlink
from nri_cni.pod.hooks import PluginHooks
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE, NetworkAttachment, PodInfo, PodNetworks
from nri_cni.pod.select import Selected, select_networks

log = logging.getLogger("nri_cni.pod")
oplog = logging.getLogger("nri_cni.podop")  # one structured line per pod operation

# CNI error codes that mean "the plugin created nothing" for an ADD (docs/reliability.md):
# 1 incompatible version, 2 unsupported field, 3 unknown container ("no DEL needed" per the
# spec), 4 invalid environment, 6 decoding failure, 7 invalid network config. libcni's skel
# returns 1, 4, 6 and 7 before the plugin's own code runs. Not 5 (I/O: anywhere), 8 (skel
# checks the netns after cmdAdd ran), 11 (try again later: a transient condition met anywhere),
# 999 or plugin-specific codes.
NOTHING_CREATED_CODES = frozenset(
    {
        CniCode.INCOMPATIBLE_VERSION,
        CniCode.UNSUPPORTED_FIELD,
        CniCode.UNKNOWN_CONTAINER,
        CniCode.INVALID_ENV,
        CniCode.DECODING_FAILURE,
        CniCode.INVALID_CONFIG,
    }
)
# PluginExecError messages for a plugin that was never exec'd (nri_cni/cni/exec.py, runtime.py)
_NOT_EXECUTED = ("failed to find plugin", "cannot run plugin", "invalid plugin name")


def nothing_created(exc: BaseException) -> bool:
    """Whether a plugin's failed ADD cannot have created anything: it was never exec'd, or it
    answered with one of NOTHING_CREATED_CODES."""
    if isinstance(exc, PluginTimeout):
        return False
    if isinstance(exc, PluginExecError):
        # ran and crashed, printed garbage or an unusable result: it may have done anything
        return exc.msg.startswith(_NOT_EXECUTED)
    return isinstance(exc, CNIError) and bool(exc.ref.plugin) and exc.code in NOTHING_CREATED_CODES


def netns_gone(path: str) -> bool:
    """The netns path a runtime gave is gone (the runtime removed it: pod stopped, or node
    rebooted). False when nothing can be said: no path, or its directory is not visible here
    (a container without the host's netns dir must never conclude that every pod is gone)."""
    if not path or not os.path.isabs(path):
        return False
    return not os.path.lexists(path) and os.path.isdir(os.path.dirname(path))


@dataclass
class OpRecord:
    """What one pod operation did, for the log line and the metrics."""

    op: str
    pod: PodInfo
    started: float = field(default_factory=time.time)
    networks: list[dict] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    error: str = ""
    error_code: int = 0  # the CNI code of the failure, for the metrics

    def emit(self) -> None:
        ended = time.time()
        line = {
            "op": self.op,
            "pod": self.pod.label(),
            "podId": self.pod.id,
            "start": round(self.started, 6),
            "end": round(ended, 6),
            "ms": round((ended - self.started) * 1000, 2),
            "networks": self.networks,
            "plugins": self.plugins,
            "result": "error" if self.error else "ok",
        }
        if self.error:
            line["error"] = self.error
        oplog.info(json.dumps(line, separators=(",", ":")))


class PodNetworker:
    def __init__(
        self,
        cfg: Config,
        cni: CNIRuntime,
        *,
        hooks: PluginHooks | None = None,
        runtime_cache: Any = None,
        intents: IntentStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.cni = cni
        self.hooks = hooks  # the same object the CNI runtime calls: per-plugin timings
        self.locks = PodLocks()
        self.intents = intents or IntentStore(cfg.state_dir)
        self.runtime_cache = runtime_cache  # ResultCache of the runtime's libcni (secondary mode)
        self.finalize_dropins = _finalize_dropins(cfg.cni.finalize_dir)
        self.on_operation: Callable[[OpRecord], None] | None = None
        self.on_gc: Callable[[dict], None] | None = None
        self.on_attached: Callable[[PodInfo], None] | None = None
        # status.refuse_when_not_ready: async (network name) -> "" when ready, else its STATUS
        # error. Set by the daemon; asked only for the networks an ADD is about to attach.
        self.readiness: Callable[[str], Awaitable[str]] | None = None
        # INIT / DEINIT per network generation (nri_cni.lifecycle.NetworkLifecycle); set by the
        # daemon. ADDs hold a lease on their generation; DELs let it re-check retired ones.
        self.lifecycle: Any = None

    def reconfigure(self, cfg: Config) -> None:
        """A new config (hot reload) applies to the next ADD; cached pods keep their config."""
        self.cfg = cfg
        self.finalize_dropins = _finalize_dropins(cfg.cni.finalize_dir)

    def _emit(self, record: OpRecord) -> None:
        if self.hooks is not None:
            record.plugins = self.hooks.drain(record.pod.id)
        record.emit()
        if self.on_operation:
            self.on_operation(record)

    # -- queries -----------------------------------------------------------------------------

    def cached(self, pod_id: str | None = None) -> list[CacheEntry]:
        return self.cni.cache.entries(container_id=pod_id)

    def attached_pod_ids(self) -> set[str]:
        return {e.container_id for e in self.cached()}

    # -- attach ------------------------------------------------------------------------------

    async def attach(
        self, pod: PodInfo, *, runtime_caps: dict | None = None, primary_ifname: str = ""
    ) -> PodNetworks:
        return await self._run_detached(self._attach(pod, runtime_caps or {}, primary_ifname))

    async def _run_detached(self, coro: Awaitable) -> Any:
        # shield: the operation finishes even if the caller is cancelled (NRI deadline).
        return await asyncio.shield(asyncio.ensure_future(coro))

    async def _attach(self, pod: PodInfo, runtime_caps: dict, primary_ifname: str) -> PodNetworks:
        record = OpRecord("add", pod)
        skip = (self.cfg.primary_network,) if self.cfg.mode == "secondary" else ()
        try:
            # A refused annotation is an operation too: it gets its log line and its metric.
            selected = select_networks(self.cfg, pod.namespace, pod.annotations, skip=skip)
            if pod.host_network:
                raise PodError(f"pod {pod.label()} has no network namespace (host network?)")
        except NriCniError as exc:
            record.error, record.error_code = str(exc), exc.cni_code
            self._emit(record)
            raise
        if primary_ifname and selected and self.cfg.mode != "secondary":
            selected[0] = Selected(selected[0].network, primary_ifname, selected[0].capability_args)
        async with self.locks.pod(pod.id):
            try:
                await self._undo_abandoned(pod, record)
                async with self._lifecycle_leases(pod, selected):  # waits for INIT
                    answer = await self._attach_locked(pod, selected, runtime_caps, record)
                if self.on_attached and record.networks:
                    # Still under the pod's lock: a GC waiting for the exclusive lock computes
                    # its valid pods after this, so a pod attached just now is never garbage.
                    # (Not for a pod that was attached already: nothing new to protect.)
                    self.on_attached(pod)
                return answer
            except NriCniError as exc:
                record.error, record.error_code = str(exc), exc.cni_code
                raise
            finally:
                if record.networks or record.error:  # not for a pod that was attached already
                    self._emit(record)

    def _lifecycle_leases(self, pod: PodInfo, selected: list[Selected]):
        """Leases on the generations this ADD will use (docs/lifecycle.md): INIT has run
        before the first ADD, fails the pod with INIT's error, and no DEINIT starts meanwhile."""
        managed = [s for s in selected if is_managed(s.network.conflist)]
        if self.lifecycle is None or not managed:
            return contextlib.nullcontext()
        existing = {(e.network_name, e.ifname) for e in self.cached(pod.id)}
        return self.lifecycle.leases(
            s.network.conflist for s in managed if (s.network.name, s.ifname) not in existing
        )

    def _attachments_gone(self) -> None:
        if self.lifecycle is not None:
            self.lifecycle.poke()  # a retired generation may have lost its last attachment

    async def _undo_abandoned(self, pod: PodInfo, record: OpRecord) -> None:
        """An intent record found under the pod's lock belongs to an ADD nobody is running any
        more (its rollback failed, or a crash): finish that rollback before a new ADD."""
        intent = self.intents.load(pod.id)
        if intent is None:
            return
        errors = await self._rollback_intent(intent, record, netns=pod.netns)
        if errors:
            raise PodError(
                f"pod {pod.label()}: an earlier failed ADD still cannot be rolled back: " + "; ".join(errors),
                network=intent.networks[-1].network,
            )

    async def _attach_locked(
        self, pod: PodInfo, selected: list[Selected], runtime_caps: dict, record: OpRecord
    ) -> PodNetworks:
        existing = {(e.network_name, e.ifname): e for e in self.cached(pod.id)}
        todo = [s for s in selected if (s.network.name, s.ifname) not in existing]
        answer = PodNetworks(pod)
        if not todo:
            # Already attached (repeated RunPodSandbox, or NRI Run after the shim's ADD).
            for sel in selected:
                entry = existing[(sel.network.name, sel.ifname)]
                answer.attachments.append(
                    NetworkAttachment(
                        sel.network.name, sel.ifname, parse_result(entry.result or {"cniVersion": "1.1.0"})
                    )
                )
            return answer
        await self._check_ready(todo)

        # keyed by (network, ifname): a pod may ask for one network twice (fast, fast@fast2)
        confs: dict[tuple[str, str], tuple[NetworkConfigList, RuntimeConf]] = {}
        for index, sel in enumerate(selected):
            caps = dict(sel.capability_args)
            if index == 0:
                caps = {**runtime_caps, **caps}  # port mappings, bandwidth... go to the primary
            confs[_key(sel)] = (
                sel.network.conflist,
                RuntimeConf(
                    container_id=pod.id,
                    netns=pod.netns,
                    ifname=sel.ifname,
                    args=pod.cni_args(),
                    capability_args=caps,
                ),
            )
        intent = Intent(
            pod.id,
            pod.netns,
            [
                IntendedNetwork(
                    s.network.name,
                    s.ifname,
                    confs[_key(s)][0].bytes,
                    confs[_key(s)][1].args,
                    confs[_key(s)][1].capability_args,
                )
                for s in todo
            ],
        )
        self.intents.write(intent)  # before any plugin runs; a failure here leaves nothing
        planned = {(n.network, n.ifname): n for n in intent.networks}

        added: list[IntendedNetwork] = []
        results: dict[tuple[str, str], Result] = {}
        try:
            for sel in selected:
                net, rt = confs[_key(sel)]
                entry = existing.get(_key(sel))
                if entry is not None:
                    results[_key(sel)] = parse_result(entry.result or {"cniVersion": "1.1.0"})
                    continue
                t0 = time.perf_counter()
                added.append(planned[_key(sel)])
                try:
                    results[_key(sel)] = await self._add_one(net, rt)
                except NriCniError as exc:
                    self._record_doomed(intent, planned[_key(sel)], net, rt, exc)
                    raise
                record.networks.append(
                    {"network": net.name, "ifname": sel.ifname, "op": "add", "ms": _ms(t0)}
                )
            await self._finalize_all(pod, selected, confs, results, record)
        except NriCniError as exc:
            # DEL what was started, last first; the record of the rest goes (never ADDed)
            errors = await self._rollback_intent(Intent(pod.id, pod.netns, added), record, op="rollback")
            raise _pod_error(pod, exc, errors) from exc
        except BaseException:
            # Cancelled or crashed mid-way: the intent record stays for start-up recovery.
            raise
        self.intents.clear(pod.id)
        for sel in selected:
            answer.attachments.append(NetworkAttachment(sel.network.name, sel.ifname, results[_key(sel)]))
        return answer

    async def _check_ready(self, todo: list[Selected]) -> None:
        """status.refuse_when_not_ready: no ADD of a network whose STATUS fails."""
        if not self.cfg.refuse_when_not_ready or self.readiness is None:
            return
        for sel in todo:
            error = await self.readiness(sel.network.name)
            if error:
                raise CNIError(
                    CniCode.PLUGIN_NOT_AVAILABLE,
                    f"network {sel.network.name!r} is not ready (STATUS failed)",
                    details=error,
                    ref=PluginRef(network=sel.network.name, command="STATUS"),
                )

    def _record_doomed(
        self,
        intent: Intent,
        planned: IntendedNetwork,
        net: NetworkConfigList,
        rt: RuntimeConf,
        exc: NriCniError,
    ) -> None:
        """Doomed delete, step 2: write down which plugin's ADD failed having created nothing."""
        failed = self.hooks.failed_index(rt.container_id, net.name, "ADD") if self.hooks else None
        if not nothing_created(exc):
            return
        plugin = exc.ref.plugin  # type: ignore[attr-defined]  (nothing_created: a CNIError)
        if failed is not None and failed < len(net.plugins) and net.plugins[failed].type == plugin:
            indexes = [failed]
        else:
            # not started at all (the runtime looks every binary up before the first one runs):
            # every position of that type in the chain is equally absent
            indexes = [i for i, p in enumerate(net.plugins) if p.type == plugin]
        planned.doomed_plugins.extend(f"{i}:{plugin}" for i in indexes)
        try:
            self.intents.write(intent)
        except NriCniError as err:
            # the rollback right below still knows; only a crash before it would forget
            log.error("pod %s: cannot record the doomed plugin %s: %s", rt.container_id[:12], plugin, err)

    async def _add_one(self, net: NetworkConfigList, rt: RuntimeConf) -> Result:
        try:
            return await self.cni.add(net, rt)
        except CNIError as exc:
            if not exc.ref.network:
                exc.ref = type(exc.ref)(network=net.name, plugin=exc.ref.plugin, command="ADD")
            raise

    async def _finalize_all(
        self,
        pod: PodInfo,
        selected: list[Selected],
        confs: dict,
        results: dict[tuple[str, str], Result],
        record: OpRecord,
    ) -> None:
        nets = [(_key(sel), *confs[_key(sel)]) for sel in selected]
        primary = await self._runtime_primary(pod)
        if primary is not None:
            key = (primary[0], primary[2].ifname)
            nets.insert(0, (key, *primary[1:3]))
            results[key] = primary[3]
        for key, net, rt in nets:
            extra = self.finalize_dropins
            if not net.finalize_plugins and not extra:
                continue
            t0 = time.perf_counter()
            # finalize() caches a result a plugin changed, so that a later DEL sees it; the
            # runtime's own primary is the runtime's attachment, never one of nri-cni's
            cni = self.cni if primary is None or key[0] != primary[0] else _without_cache(self.cni)
            result = await cni.finalize(net, rt, results[key], extra)
            results[key] = result
            record.networks.append(
                {"network": net.name, "ifname": rt.ifname, "op": "finalize", "ms": _ms(t0)}
            )
        for key, _net, rt in nets:
            if primary is None or key[0] != primary[0]:
                results[key] = await netlink.fill_interface_details(rt.netns, results[key])

    async def _runtime_primary(self, pod: PodInfo):
        """Secondary mode: the runtime's own network, read from the runtime's libcni cache."""
        if self.cfg.mode != "secondary" or self.runtime_cache is None:
            return None
        entry = self.runtime_cache.read(self.cfg.primary_network, pod.id, "eth0")
        if entry is None or entry.result is None:
            log.warning(
                "pod %s: no cached result of the runtime's network %r; FINALIZE skips it",
                pod.label(),
                self.cfg.primary_network,
            )
            return None
        net = parse_conflist(entry.config, source=entry.path)
        rt = RuntimeConf(
            container_id=pod.id,
            netns=pod.netns or entry.netns,
            ifname="eth0",
            args=list(entry.cni_args),
            capability_args=dict(entry.capability_args),
        )
        return (net.name, net, rt, parse_result(entry.result))

    # -- rollback: undo what an intent record names ----------------------------------------

    async def _rollback_intent(
        self, intent: Intent, record: OpRecord, *, netns: str = "", op: str = "rollback"
    ) -> list[str]:
        """DEL every network of the record, last first (from its cache entry when it has one,
        else from the config the record holds), ignoring DEL failures of doomed plugins. The
        record goes when all succeeded; otherwise it keeps the networks still to undo, for the
        next try (the pod's DEL, GC, start-up). Returns the failures."""
        errors: list[str] = []
        left: list[IntendedNetwork] = []
        for net in reversed(intent.networks):
            cached = self.cni.cache.read(net.network, intent.pod_id, net.ifname)
            entry = cached or CacheEntry(
                container_id=intent.pod_id,
                ifname=net.ifname,
                network_name=net.network,
                config=net.config,
                netns=intent.netns,
                cni_args=list(net.cni_args),
                capability_args=dict(net.capability_args),
                result=None,
                path="",
            )
            t0 = time.perf_counter()
            try:
                await self._delete_entry(entry, netns=netns or intent.netns, doomed=net.doomed_indexes())
            except NriCniError as exc:
                errors.append(f"network {net.network!r}: {exc}")
                left.insert(0, net)
                if op == "recover":
                    log.error(
                        "recovery: DEL of %s for pod %s failed: %s (GC will retry)",
                        net.network,
                        intent.pod_id,
                        exc,
                    )
                else:
                    log.error(
                        "pod %s: rollback DEL of network %r failed: %s (GC will retry)",
                        record.pod.label(),
                        net.network,
                        exc,
                    )
            record.networks.append({"network": net.network, "ifname": net.ifname, "op": op, "ms": _ms(t0)})
        if not errors:
            self.intents.clear(intent.pod_id)
            return errors
        intent = Intent(intent.pod_id, intent.netns, left, rollback_error="; ".join(errors))
        try:
            self.intents.write(intent)
        except NriCniError as exc:  # the older record (a superset) is still on disk
            log.error("pod %s: cannot update the intent record: %s", intent.pod_id[:12], exc)
        return errors

    async def _delete_entry(
        self, entry: CacheEntry, *, netns: str = "", doomed: set[int] | frozenset[int] = frozenset()
    ) -> None:
        # The runtime removes the netns after its DEL; a DEL with the netns gone still runs
        # with an empty CNI_NETNS so that IPAM releases the address.
        if netns and not os.path.exists(netns):
            netns = ""
        elif not netns and entry.netns and os.path.exists(entry.netns):
            netns = entry.netns
        entry = dataclasses.replace(entry, netns=netns)
        if not doomed:
            await self.cni.delete_cached(entry)
            return
        net = parse_conflist(entry.config, source=f"cache:{entry.path}" if entry.path else "intent")
        rt = RuntimeConf(
            container_id=entry.container_id,
            netns=netns,
            ifname=entry.ifname,
            args=list(entry.cni_args),
            capability_args=dict(entry.capability_args),
        )
        # The chain in reverse, cut around each doomed plugin: its DEL runs alone and its
        # failure is logged only, so the plugins before it still get their DEL.
        segments: list[list[int]] = []
        for i in reversed(range(len(net.plugins))):
            if i in doomed or not segments or segments[-1][0] in doomed:
                segments.append([i])
            else:
                segments[-1].insert(0, i)
        for seg in segments:
            part = dataclasses.replace(net, plugins=tuple(net.plugins[i] for i in seg))
            try:
                await self.cni.delete(part, rt)
            except NriCniError as exc:
                if seg[0] not in doomed:
                    raise
                log.info(
                    "pod %s: DEL of plugin %s (network %r), whose ADD created nothing, failed; ignored: %s",
                    entry.container_id[:12],
                    net.plugins[seg[0]].type,
                    net.name,
                    exc,
                )

    # -- detach ------------------------------------------------------------------------------

    async def detach(self, pod: PodInfo) -> None:
        await self._run_detached(self._detach(pod))

    async def _detach(self, pod: PodInfo, op: str = "del") -> None:
        record = OpRecord(op, pod)
        async with self.locks.pod(pod.id):
            errors = await self._detach_locked(pod, record)
            if errors:
                record.error = "; ".join(errors)
            if record.networks or errors:
                self._emit(record)
            else:  # NRI stop, NRI remove and the runtime's CNI DELs all arrive: one did the work
                if self.hooks is not None:
                    self.hooks.drain(pod.id)
                log.debug("pod %s: %s found nothing to detach", pod.label(), op)
            if errors:
                raise PodError(
                    f"pod {pod.label()}: DEL failed for {len(errors)} network(s): " + "; ".join(errors)
                )

    async def _detach_locked(self, pod: PodInfo, record: OpRecord) -> list[str]:
        """Under the pod's lock: roll back a left-over ADD, then DEL every cached network in
        reverse. Every DEL is tried; the failures are returned (their state stays for GC)."""
        errors: list[str] = []
        intent = self.intents.load(pod.id)
        if intent is not None:
            errors += await self._rollback_intent(intent, record, netns=pod.netns)
        for entry in reversed(self._attach_order(self.cached(pod.id))):
            t0 = time.perf_counter()
            try:
                await self._delete_entry(entry, netns=pod.netns)
            except NriCniError as exc:
                errors.append(f"network {entry.network_name!r}: {exc}")
            record.networks.append(
                {"network": entry.network_name, "ifname": entry.ifname, "op": "del", "ms": _ms(t0)}
            )
        self._attachments_gone()  # detach and the reaper
        return errors

    @staticmethod
    def _attach_order(entries: list[CacheEntry]) -> list[CacheEntry]:
        # eth0 first, then net1, net2... (the order ADD used), so reversed() deletes net2 first.
        def key(e: CacheEntry):
            name = e.ifname
            return (0 if name == "eth0" else 1, len(name), name)

        return sorted(entries, key=key)

    # -- check -------------------------------------------------------------------------------

    async def check(self, pod: PodInfo) -> None:
        async with self.locks.pod(pod.id):
            for entry in self._attach_order(self.cached(pod.id)):
                net = parse_conflist(entry.config, source=entry.path)
                await self.cni.check(
                    net,
                    RuntimeConf(
                        container_id=pod.id,
                        netns=pod.netns or entry.netns,
                        ifname=entry.ifname,
                        args=list(entry.cni_args),
                        capability_args=dict(entry.capability_args),
                    ),
                )

    # -- GC, reaper and recovery -------------------------------------------------------------

    def pending_rollbacks(self) -> list[str]:
        """Pods with an intent record and no operation in flight: a rollback waiting to be
        retried (or, for an instant, an ADD about to take its lock)."""
        return [p for p in self.intents.pod_ids() if not self.locks.busy(p)]

    async def gc(self, valid_pod_ids: set[str] | Callable[[], set[str]]) -> dict:
        """Converge on the runtime's pod list, alone (the exclusive lock): roll back every
        intent record left over (none can be in progress now), DEL every attachment of a pod
        not in the list or whose netns is gone, then the CNI GC verb for every network list
        (unless disableGC) with the attachments that remain.

        `valid_pod_ids` may be a callable: it is then evaluated once the lock is held, so that
        an ADD that finished while GC waited counts."""
        report: dict[str, list[str]] = {"deleted": [], "rolledBack": [], "errors": []}
        async with self.locks.exclusive():
            valid = set(valid_pod_ids() if callable(valid_pod_ids) else valid_pod_ids)
            for intent in self.intents.load_all():
                record = OpRecord("gc-rollback", PodInfo(intent.pod_id))
                errors = await self._rollback_intent(intent, record)
                record.error = "; ".join(errors)
                self._emit(record)
                if errors:
                    report["errors"] += [f"rollback of pod {intent.pod_id}: {e}" for e in errors]
                else:
                    report["rolledBack"].append(intent.pod_id)
            for pod_id, entries in self._by_pod(self.cached()).items():
                if pod_id in valid and not self._netns_gone(entries):
                    continue
                record = OpRecord("gc-del", _pod_of(entries[0]))
                for entry in reversed(self._attach_order(entries)):
                    name = f"{entry.network_name}/{entry.container_id}/{entry.ifname}"
                    try:
                        await self._delete_entry(entry)
                        report["deleted"].append(name)
                    except NriCniError as exc:
                        report["errors"].append(f"DEL {name}: {exc}")
                        record.error, record.error_code = str(exc), exc.cni_code
                    record.networks.append(
                        {"network": entry.network_name, "ifname": entry.ifname, "op": "del"}
                    )
                self._emit(record)
            valid_attachments: dict[str, list[Attachment]] = {}
            for entry in self.cached():
                valid_attachments.setdefault(entry.network_name, []).append(
                    Attachment(entry.container_id, entry.ifname)
                )
            for spec in self.cfg.networks:
                try:
                    await self.cni.gc(spec.conflist, valid_attachments.get(spec.name, []))
                except NriCniError as exc:
                    report["errors"].append(f"GC {spec.name}: {exc}")
        self._attachments_gone()
        log.info(
            "gc: %d attachment(s) deleted, %d rollback(s) finished, %d error(s)",
            len(report["deleted"]),
            len(report["rolledBack"]),
            len(report["errors"]),
        )
        for err in report["errors"]:
            log.error("gc: %s", err)
        if self.on_gc:
            self.on_gc(report)
        return report

    async def reap(self) -> list[str]:
        """Detach every attachment whose recorded netns path is gone and whose pod has no
        operation in flight. Cheap (a stat per pod), for a short timer: containerd 2.1.9 sends
        no NRI stop/remove for a pod that lived through its restart (containerd#8426)."""
        reaped = []
        for pod_id, entries in self._by_pod(self.cached()).items():
            if self.locks.busy(pod_id) or not self._netns_gone(entries):
                continue
            record = OpRecord("reap", _pod_of(entries[0]))
            async with self.locks.pod(pod_id):
                entries = self.cached(pod_id)
                if not entries or not self._netns_gone(entries):
                    continue  # attached again meanwhile, or already detached
                errors = await self._detach_locked(record.pod, record)
                record.error = "; ".join(errors)
                self._emit(record)
            if errors:
                log.error(
                    "reaper: pod %s (netns gone): DEL failed, GC retries: %s",
                    record.pod.label(),
                    record.error,
                )
            else:
                log.info(
                    "reaper: detached pod %s, whose netns %s is gone", record.pod.label(), entries[0].netns
                )
                reaped.append(pod_id)
        return reaped

    @staticmethod
    def _netns_gone(entries: list[CacheEntry]) -> bool:
        paths = {e.netns for e in entries if e.netns}
        return bool(paths) and all(netns_gone(p) for p in paths)

    @staticmethod
    def _by_pod(entries: list[CacheEntry]) -> dict[str, list[CacheEntry]]:
        out: dict[str, list[CacheEntry]] = {}
        for entry in entries:
            out.setdefault(entry.container_id, []).append(entry)
        return out

    async def recover_intents(self) -> int:
        """Start-up: roll back every ADD a crash interrupted (a failing rollback keeps its
        record, retried by the pod's DEL and by GC), and drop the cache's temp files that a
        crash in the middle of a cache write left behind."""
        self._sweep_cache_temp_files()
        intents = self.intents.load_all()
        for intent in intents:
            record = OpRecord("recover", PodInfo(intent.pod_id))
            async with self.locks.pod(intent.pod_id):
                errors = await self._rollback_intent(intent, record, op="recover")
            record.error = "; ".join(errors)
            self._emit(record)
            if errors:
                log.warning(
                    "recovery: could not yet roll back the interrupted ADD of pod %s "
                    "(%d of %d network(s) left)",
                    intent.pod_id,
                    len(errors),
                    len(intent.networks),
                )
            else:
                log.warning(
                    "recovery: rolled back the interrupted ADD of pod %s (%d network(s))",
                    intent.pod_id,
                    len(intent.networks),
                )
        return len(intents)

    def _sweep_cache_temp_files(self) -> None:
        # fsutil.write_atomic's temporary files; only this process writes nri-cni's cache dir,
        # and at start-up nothing is being written yet.
        results = self.cni.cache.results_dir
        try:
            names = os.listdir(results)
        except OSError:
            return
        mine = f".{os.getpid()}."
        for name in names:
            if is_temporary(name) and mine not in name:
                try:
                    os.unlink(os.path.join(results, name))
                    log.warning("removed %s/%s, a cache write cut short", results, name)
                except OSError as exc:
                    log.warning("cannot remove %s/%s: %s", results, name, exc.strerror)


def _finalize_dropins(path: str) -> tuple[PluginConf, ...]:
    # The config names the `_finalize.d` dir itself (validated); libcni's rule reads it below
    # a conf dir.
    if not path or not os.path.isdir(path):
        return ()
    plugins, errors = load_finalize_dropins(os.path.dirname(path.rstrip("/")))
    for err in errors:
        log.error("finalize drop-in skipped: %s", err)
    return plugins


def _pod_error(pod: PodInfo, exc: NriCniError, rollback_errors: list[str] = ()) -> PodError:
    where = ""
    if rollback_errors:
        where += (
            f"; undoing it failed too, retried later ({len(rollback_errors)} network(s): "
            + "; ".join(rollback_errors)
            + ")"
        )
    return PodError(
        f"pod {pod.label()}: networking failed{where}",
        cause=exc,
        network=getattr(getattr(exc, "ref", None), "network", ""),
    )


def _pod_of(entry: CacheEntry) -> PodInfo:
    """The pod a cache entry belongs to, named from the CNI_ARGS it was added with."""
    args = dict(entry.cni_args)
    return PodInfo(
        id=entry.container_id, name=args.get(K8S_POD_NAME, ""), namespace=args.get(K8S_POD_NAMESPACE, "")
    )


def _without_cache(cni: CNIRuntime) -> CNIRuntime:
    """The same runtime (executor, hooks, bin dirs) with its cache step (`cache_result`, made
    to be overridden) a no-op."""
    view = copy.copy(cni)

    async def no_cache(net, rt, result, prepared=None) -> None:
        return None

    view.cache_result = no_cache  # type: ignore[method-assign]
    return view


def _key(sel: Selected) -> tuple[str, str]:
    return (sel.network.name, sel.ifname)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)
