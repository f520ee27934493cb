"""detach and check: one pod's networks, from the cache, under the pod's lock.

detach DELs every cached network of the pod in reverse, from the cache (never from the current
config: a reload between ADD and DEL must not change what DEL sees). Idempotent, so the first
of NRI StopPodSandbox and the runtime's CNI DEL does the work and the second finds nothing.
"""

from __future__ import annotations

import time

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.cni.prev_result import conf_of
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.errors import NriCniError
from nri_cni.lifecycle import NetworkLifecycle
from nri_cni.pod.intents import IntentStore
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import NetworkFailure, OpRecord
from nri_cni.pod.rollback import Rollback


class Detacher:
    def __init__(
        self,
        cni: CNIRuntime,
        *,
        intents: IntentStore,
        rollback: Rollback,
        lifecycle: NetworkLifecycle | None = None,
    ) -> None:
        self.cni = cni
        self.intents = intents
        self.rollback = rollback
        self.lifecycle = lifecycle

    async def detach(self, pod: PodInfo, record: OpRecord) -> list[NetworkFailure]:
        """Roll back a left-over ADD, then DEL every cached network in reverse. Every DEL is
        tried; the failures are returned (their state stays for GC)."""
        errors: list[NetworkFailure] = []
        intent = self.intents.load(pod.id)
        if intent is not None:
            errors += await self.rollback.undo(intent, record, netns=pod.netns)
        for entry in reversed(attach_order(self.cni.cache.entries(container_id=pod.id))):
            t0 = time.perf_counter()
            try:
                await self.rollback.delete_entry(entry, netns=pod.netns, observe=record)
            except NriCniError as exc:
                errors.append(NetworkFailure(entry.network_name, exc))
            record.step(entry.network_name, entry.ifname, "del", t0)
        self.attachments_gone()  # detach and the reaper
        return errors

    def attachments_gone(self) -> None:
        if self.lifecycle is not None:
            self.lifecycle.poke()  # a retired generation may have lost its last attachment

    async def check(self, pod: PodInfo, record: OpRecord) -> None:
        for entry in attach_order(self.cni.cache.entries(container_id=pod.id)):
            net = parse_conflist(entry.config, source=entry.path)
            t0 = time.perf_counter()
            try:
                await self.cni.check(
                    net, conf_of(entry, pod.netns or entry.netns), observe=record, entry=entry
                )
            finally:
                record.step(entry.network_name, entry.ifname, "check", t0)


def attach_order(entries: list[CacheEntry]) -> list[CacheEntry]:
    """eth0 first, then net1, net2... (the order ADD used), so reversed() deletes net2 first."""

    def key(e: CacheEntry) -> tuple[int, int, str]:
        name = e.ifname
        return (0 if name == "eth0" else 1, len(name), name)

    return sorted(entries, key=key)
