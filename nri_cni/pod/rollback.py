"""Undoing what an intent record names: the DELs after a failed or interrupted ADD.

An intent record (intents.py) lists the networks an ADD was about to attach. Undoing it DELs
each, last first: from its cache entry when the ADD got that far, else from the config the
record holds. A plugin whose ADD failed having created nothing (`nothing_created`) is recorded
as doomed: its DEL still runs, but its failure neither stops the DEL of the plugins before it
nor counts as a failure (docs/reliability.md, "doomed delete").
"""

from __future__ import annotations

import dataclasses
import logging
import time

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import NetworkConfigList, parse_conflist
from nri_cni.cni.prev_result import conf_of, entry_of
from nri_cni.cni.runtime import CNIRuntime, PluginObserver, RuntimeConf
from nri_cni.errors import CniCode, CNIError, Kind, NriCniError
from nri_cni.node.workers import is_netns
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.oprecord import NetworkFailure, OpRecord

log = logging.getLogger("nri_cni.pod")

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


def nothing_created(exc: BaseException) -> bool:
    """Whether a plugin's failed ADD cannot have created anything: it was never run, or it
    answered with one of NOTHING_CREATED_CODES. Read from the error's kind, never its text."""
    if not isinstance(exc, NriCniError):
        return False
    if exc.kind is Kind.PLUGIN_NOT_RUN:
        return True
    return (
        exc.kind is Kind.PLUGIN_ERROR
        and isinstance(exc, CNIError)
        and bool(exc.ref.plugin)
        and exc.cni_code in NOTHING_CREATED_CODES
    )


class Rollback:
    """DELs what intent records name, and DELs cache entries (the doomed plugins apart)."""

    def __init__(self, cni: CNIRuntime, intents: IntentStore) -> None:
        self.cni = cni
        self.intents = intents

    async def undo(
        self, intent: Intent, record: OpRecord, *, netns: str = "", op: str = "rollback"
    ) -> list[NetworkFailure]:
        """DEL every network of the record, last first (from its cache entry when it has one,
        else from the config the record holds), ignoring DEL failures of doomed plugins. The
        record goes when all succeeded; otherwise it keeps the networks still to undo, for the
        next try (the pod's DEL, GC, start-up). Returns the failures."""
        errors: list[NetworkFailure] = []
        left: list[IntendedNetwork] = []
        for net in reversed(intent.networks):
            cached = self.cni.cache.read(net.network, intent.pod_id, net.ifname)
            rt = RuntimeConf(
                intent.pod_id, intent.netns, net.ifname, list(net.cni_args), dict(net.capability_args)
            )
            entry = cached or entry_of(net.network, net.config, rt)
            t0 = time.perf_counter()
            try:
                await self.delete_entry(
                    entry, netns=netns or intent.netns, doomed=net.doomed_indexes(), observe=record
                )
            except NriCniError as exc:
                errors.append(NetworkFailure(net.network, exc))
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
            record.step(net.network, net.ifname, op, t0)
        if not errors:
            self.intents.clear(intent.pod_id)
            return errors
        intent = Intent(intent.pod_id, intent.netns, left, rollback_error="; ".join(map(str, errors)))
        try:
            self.intents.write(intent)
        except NriCniError as exc:  # the older record (a superset) is still on disk
            log.error("pod %s: cannot update the intent record: %s", intent.pod_id[:12], exc)
        return errors

    async def delete_entry(
        self,
        entry: CacheEntry,
        *,
        netns: str = "",
        doomed: set[int] | frozenset[int] = frozenset(),
        observe: PluginObserver | None = None,
    ) -> None:
        # The runtime removes the netns after its DEL; a DEL with the netns gone (the path
        # missing, or a file that is no netns any more: a plugin given it fails) still runs
        # with an empty CNI_NETNS so that IPAM releases the address.
        if netns and not is_netns(netns):
            netns = ""
        elif not netns and entry.netns and is_netns(entry.netns):
            netns = entry.netns
        entry = dataclasses.replace(entry, netns=netns)
        if not doomed:
            await self.cni.delete_cached(entry, observe=observe)
            return
        net = parse_conflist(entry.config, source=f"cache:{entry.path}" if entry.path else "intent")
        rt = conf_of(entry)  # the netns just set
        # The chain in reverse, cut around each doomed plugin: its DEL runs alone and its
        # failure is logged only, so the plugins before it still get their DEL. Every part
        # gets the one prevResult; the cache entry goes once every part is done.
        prev = self.cni.del_prev(net, rt, entry)
        segments: list[list[int]] = []
        for i in reversed(range(len(net.plugins))):
            if i in doomed or not segments or segments[-1][0] in doomed:
                segments.append([i])
            else:
                segments[-1].insert(0, i)
        for seg in segments:
            part = dataclasses.replace(net, plugins=tuple(net.plugins[i] for i in seg))
            try:
                await self.cni.delete_part(part, rt, prev, observe=observe)
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
        self.cni.cache.delete(net.name, rt.container_id, rt.ifname)

    def record_doomed(
        self,
        intent: Intent,
        planned: IntendedNetwork,
        net: NetworkConfigList,
        rt: RuntimeConf,
        exc: NriCniError,
    ) -> None:
        """Doomed delete, step 2: write down which plugin's ADD failed having created nothing."""
        failed = exc.plugin_index if isinstance(exc, CNIError) else None  # the runtime's word
        if not nothing_created(exc) or not isinstance(exc, CNIError):
            return
        plugin = exc.ref.plugin
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
