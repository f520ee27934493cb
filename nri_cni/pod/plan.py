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
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import NetworkConfigList, PluginConf, load_finalize_dropins, parse_conflist
from nri_cni.cni.result import Result, parse_result
from nri_cni.cni.runtime import Attachment, CNIRuntime, RuntimeConf
from nri_cni.config import Config
from nri_cni.errors import CNIError, NriCniError, PodError
from nri_cni.pod import netlink
from nri_cni.pod.hooks import PluginHooks
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import NetworkAttachment, PodInfo, PodNetworks
from nri_cni.pod.select import Selected, select_networks

log = logging.getLogger("nri_cni.pod")
oplog = logging.getLogger("nri_cni.podop")  # one structured line per pod operation


@dataclass
class OpRecord:
    """What one pod operation did, for the log line and the metrics."""

    op: str
    pod: PodInfo
    started: float = field(default_factory=time.time)
    networks: list[dict] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    error: str = ""

    def emit(self) -> None:
        ended = time.time()
        line = {
            "op": self.op, "pod": self.pod.label(), "podId": self.pod.id,
            "start": round(self.started, 6), "end": round(ended, 6),
            "ms": round((ended - self.started) * 1000, 2),
            "networks": self.networks, "plugins": self.plugins,
            "result": "error" if self.error else "ok",
        }
        if self.error:
            line["error"] = self.error
        oplog.info(json.dumps(line, separators=(",", ":")))


class PodNetworker:
    def __init__(self, cfg: Config, cni: CNIRuntime, *, hooks: PluginHooks | None = None,
                 runtime_cache: Any = None, intents: IntentStore | None = None) -> None:
        self.cfg = cfg
        self.cni = cni
        self.hooks = hooks  # the same object the CNI runtime calls: per-plugin timings
        self.locks = PodLocks()
        self.intents = intents or IntentStore(cfg.state_dir)
        self.runtime_cache = runtime_cache  # ResultCache of the runtime's libcni (secondary mode)
        self.finalize_dropins = _finalize_dropins(cfg.cni.finalize_dir)
        self.on_operation: Callable[[OpRecord], None] | None = None

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

    async def attach(self, pod: PodInfo, *, runtime_caps: dict | None = None,
                     primary_ifname: str = "") -> PodNetworks:
        return await self._run_detached(self._attach(pod, runtime_caps or {}, primary_ifname))

    async def _run_detached(self, coro: Awaitable) -> Any:
        # shield: the operation finishes even if the caller is cancelled (NRI deadline).
        return await asyncio.shield(asyncio.ensure_future(coro))

    async def _attach(self, pod: PodInfo, runtime_caps: dict, primary_ifname: str) -> PodNetworks:
        skip = (self.cfg.primary_network,) if self.cfg.mode == "secondary" else ()
        selected = select_networks(self.cfg, pod.namespace, pod.annotations, skip=skip)
        if primary_ifname and selected and self.cfg.mode != "secondary":
            selected[0] = Selected(selected[0].network, primary_ifname, selected[0].capability_args)
        if pod.host_network:
            raise PodError(f"pod {pod.label()} has no network namespace (host network?)")
        record = OpRecord("add", pod)
        async with self.locks.pod(pod.id):
            try:
                return await self._attach_locked(pod, selected, runtime_caps, record)
            except NriCniError as exc:
                record.error = str(exc)
                raise
            finally:
                self._emit(record)

    async def _attach_locked(self, pod: PodInfo, selected: list[Selected], runtime_caps: dict,
                             record: OpRecord) -> PodNetworks:
        existing = {(e.network_name, e.ifname): e for e in self.cached(pod.id)}
        todo = [s for s in selected if (s.network.name, s.ifname) not in existing]
        answer = PodNetworks(pod)
        if not todo:
            # Already attached (repeated RunPodSandbox, or NRI Run after the shim's ADD).
            for sel in selected:
                entry = existing[(sel.network.name, sel.ifname)]
                answer.attachments.append(NetworkAttachment(
                    sel.network.name, sel.ifname, parse_result(entry.result or {"cniVersion": "1.1.0"})))
            return answer

        confs: dict[str, tuple[NetworkConfigList, RuntimeConf]] = {}
        for index, sel in enumerate(selected):
            caps = dict(sel.capability_args)
            if index == 0:
                caps = {**runtime_caps, **caps}  # port mappings, bandwidth... go to the primary
            confs[sel.network.name] = (sel.network.conflist, RuntimeConf(
                container_id=pod.id, netns=pod.netns, ifname=sel.ifname,
                args=pod.cni_args(), capability_args=caps))
        self.intents.write(Intent(pod.id, pod.netns, [
            IntendedNetwork(s.network.name, s.ifname, confs[s.network.name][0].bytes,
                            confs[s.network.name][1].args, confs[s.network.name][1].capability_args)
            for s in todo]))

        added: list[Selected] = []
        results: dict[str, Result] = {}
        try:
            for sel in selected:
                net, rt = confs[sel.network.name]
                entry = existing.get((sel.network.name, sel.ifname))
                if entry is not None:
                    results[sel.network.name] = parse_result(entry.result or {"cniVersion": "1.1.0"})
                    continue
                t0 = time.perf_counter()
                added.append(sel)
                results[sel.network.name] = await self._add_one(net, rt)
                record.networks.append({"network": net.name, "ifname": sel.ifname, "op": "add",
                                        "ms": _ms(t0)})
            await self._finalize_all(pod, selected, confs, results, record)
        except NriCniError as exc:
            await self._rollback(pod, added, confs, record)
            self.intents.clear(pod.id)
            raise _pod_error(pod, exc) from exc
        except BaseException:
            # Cancelled or crashed mid-way: the intent record stays for start-up recovery.
            raise
        self.intents.clear(pod.id)
        for sel in selected:
            answer.attachments.append(NetworkAttachment(sel.network.name, sel.ifname,
                                                        results[sel.network.name]))
        return answer

    async def _add_one(self, net: NetworkConfigList, rt: RuntimeConf) -> Result:
        try:
            return await self.cni.add(net, rt)
        except CNIError as exc:
            if not exc.ref.network:
                exc.ref = type(exc.ref)(network=net.name, plugin=exc.ref.plugin, command="ADD")
            raise

    async def _finalize_all(self, pod: PodInfo, selected: list[Selected], confs: dict,
                            results: dict[str, Result], record: OpRecord) -> None:
        nets = [(sel.network.name, *confs[sel.network.name]) for sel in selected]
        primary = await self._runtime_primary(pod)
        if primary is not None:
            nets.insert(0, primary)
            results[primary[0]] = primary[3]
        for name, net, rt, *_ in nets:
            extra = self.finalize_dropins
            if not net.finalize_plugins and not extra:
                continue
            t0 = time.perf_counter()
            result = await self.cni.finalize(net, rt, results[name], extra)
            results[name] = result  # finalize() cached it when a plugin changed it
            record.networks.append({"network": name, "ifname": rt.ifname, "op": "finalize",
                                    "ms": _ms(t0)})
        for name, net, rt, *_ in nets:
            if primary is None or name != primary[0]:
                results[name] = await netlink.fill_interface_details(rt.netns, results[name])

    async def _runtime_primary(self, pod: PodInfo):
        """Secondary mode: the runtime's own network, read from the runtime's libcni cache."""
        if self.cfg.mode != "secondary" or self.runtime_cache is None:
            return None
        entry = self.runtime_cache.read(self.cfg.primary_network, pod.id, "eth0")
        if entry is None or entry.result is None:
            log.warning("pod %s: no cached result of the runtime's network %r; FINALIZE skips it",
                        pod.label(), self.cfg.primary_network)
            return None
        net = parse_conflist(entry.config, source=entry.path)
        rt = RuntimeConf(container_id=pod.id, netns=pod.netns or entry.netns, ifname="eth0",
                         args=list(entry.cni_args), capability_args=dict(entry.capability_args))
        return (net.name, net, rt, parse_result(entry.result))

    async def _rollback(self, pod: PodInfo, added: list[Selected], confs: dict,
                        record: OpRecord) -> None:
        for sel in reversed(added):
            net, rt = confs[sel.network.name]
            try:
                await self.cni.delete(net, rt)
            except NriCniError as exc:
                # Left to GC (the cache entry, if any, stays); the ADD error is what counts.
                log.error("pod %s: rollback DEL of network %r failed: %s", pod.label(), net.name, exc)
            record.networks.append({"network": net.name, "ifname": sel.ifname, "op": "rollback"})

    # -- detach ------------------------------------------------------------------------------

    async def detach(self, pod: PodInfo) -> None:
        await self._run_detached(self._detach(pod))

    async def _detach(self, pod: PodInfo) -> None:
        record = OpRecord("del", pod)
        async with self.locks.pod(pod.id):
            errors = []
            for entry in reversed(self._attach_order(self.cached(pod.id))):
                t0 = time.perf_counter()
                try:
                    await self._delete_entry(entry, netns=pod.netns)
                except NriCniError as exc:
                    errors.append(f"network {entry.network_name!r}: {exc}")
                record.networks.append({"network": entry.network_name, "ifname": entry.ifname,
                                        "op": "del", "ms": _ms(t0)})
            if errors:
                record.error = "; ".join(errors)
            self._emit(record)
            if errors:
                raise PodError(f"pod {pod.label()}: DEL failed for {len(errors)} network(s): "
                               + "; ".join(errors))

    async def _delete_entry(self, entry: CacheEntry, *, netns: str = "") -> None:
        # The runtime removes the netns after its DEL; a DEL with the netns gone still runs
        # with an empty CNI_NETNS so that IPAM releases the address.
        if netns and not os.path.exists(netns):
            netns = ""
        elif not netns and entry.netns and os.path.exists(entry.netns):
            netns = entry.netns
        await self.cni.delete_cached(dataclasses.replace(entry, netns=netns))

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
                await self.cni.check(net, RuntimeConf(
                    container_id=pod.id, netns=pod.netns or entry.netns, ifname=entry.ifname,
                    args=list(entry.cni_args), capability_args=dict(entry.capability_args)))

    # -- GC and recovery ---------------------------------------------------------------------

    async def gc(self, valid_pod_ids: set[str]) -> dict:
        """Converge on the runtime's pod list: DEL every attachment of a pod not in it, then the
        CNI GC verb for every network list with the attachments that remain valid."""
        report = {"deleted": [], "errors": []}
        async with self.locks.exclusive():
            for entry in self.cached():
                if entry.container_id in valid_pod_ids:
                    continue
                try:
                    await self._delete_entry(entry)
                    report["deleted"].append(f"{entry.network_name}/{entry.container_id}/{entry.ifname}")
                except NriCniError as exc:
                    report["errors"].append(f"DEL {entry.network_name}/{entry.container_id}: {exc}")
            valid = {}
            for entry in self.cached():
                valid.setdefault(entry.network_name, []).append(Attachment(entry.container_id, entry.ifname))
            for spec in self.cfg.networks:
                try:
                    await self.cni.gc(spec.conflist, valid.get(spec.name, []))
                except NriCniError as exc:
                    report["errors"].append(f"GC {spec.name}: {exc}")
        log.info("gc: %d attachment(s) deleted, %d error(s)", len(report["deleted"]), len(report["errors"]))
        for err in report["errors"]:
            log.error("gc: %s", err)
        return report

    async def recover_intents(self) -> int:
        """Start-up: roll back every ADD a crash interrupted."""
        intents = self.intents.load_all()
        for intent in intents:
            async with self.locks.pod(intent.pod_id):
                for net in reversed(intent.networks):
                    cached = self.cni.cache.read(net.network, intent.pod_id, net.ifname)
                    entry = cached or CacheEntry(
                        container_id=intent.pod_id, ifname=net.ifname, network_name=net.network,
                        config=net.config, netns=intent.netns, cni_args=list(net.cni_args),
                        capability_args=dict(net.capability_args), result=None, path="")
                    try:
                        await self._delete_entry(entry, netns=intent.netns)
                    except NriCniError as exc:
                        log.error("recovery: DEL of %s for pod %s failed: %s (GC will retry)",
                                  net.network, intent.pod_id, exc)
                self.intents.clear(intent.pod_id)
            log.warning("recovery: rolled back the interrupted ADD of pod %s (%d network(s))",
                        intent.pod_id, len(intent.networks))
        return len(intents)


def _finalize_dropins(path: str) -> tuple[PluginConf, ...]:
    # The config names the `_finalize.d` dir itself (validated); libcni's rule reads it below
    # a conf dir.
    if not path or not os.path.isdir(path):
        return ()
    plugins, errors = load_finalize_dropins(os.path.dirname(path.rstrip("/")))
    for err in errors:
        log.error("finalize drop-in skipped: %s", err)
    return plugins


def _pod_error(pod: PodInfo, exc: NriCniError) -> PodError:
    where = ""
    if isinstance(exc, CNIError) and str(exc.ref):
        where = f" ({exc.ref})"
    return PodError(f"pod {pod.label()}: networking failed{where}", cause=exc,
                    network=getattr(getattr(exc, "ref", None), "network", ""))


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)
