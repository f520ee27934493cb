"""Upkeep: what keeps the node converging on the runtime's pods when no pod event says so.

- collect_garbage: the runtime's pod list is the truth; roll back every intent record left
  over, DEL every attachment of a pod not in the list or whose netns is gone, then the CNI GC
  verb for every network list with the attachments that remain. Runs alone (the pod service
  holds the exclusive lock).
- reap: a pod whose netns the runtime removed without telling us (containerd 2.1.9 sends no NRI
  stop/remove for pods that lived through its restart, containerd#8426) is detached.
- recover: at start-up, roll back every ADD a crash interrupted.

Nothing leaks (docs/reliability.md): what a pod holds is either a cache entry (a finished
attachment) or an intent record (an ADD that did not finish, or whose rollback failed); these
work through both until every DEL succeeded.
"""

from __future__ import annotations

import logging
import os

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.runtime import Attachment, CNIRuntime
from nri_cni.config import Config
from nri_cni.errors import NriCniError
from nri_cni.fsutil import is_temporary
from nri_cni.pod.detach import Detacher, attach_order
from nri_cni.pod.intents import Intent
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE, PodInfo
from nri_cni.pod.oprecord import GcReport, OperationLog, OpRecord
from nri_cni.pod.rollback import Rollback

log = logging.getLogger("nri_cni.pod")


def netns_gone(path: str) -> bool:
    """The netns path a runtime gave is gone (the runtime removed it: pod stopped, or node
    rebooted). False when nothing can be said: no path, or its directory is not visible here
    (a container without the host's netns dir must never conclude that every pod is gone)."""
    if not path or not os.path.isabs(path):
        return False
    return not os.path.lexists(path) and os.path.isdir(os.path.dirname(path))


class Upkeep:
    def __init__(
        self, cfg: Config, cni: CNIRuntime, *, rollback: Rollback, detacher: Detacher, oplog: OperationLog
    ) -> None:
        self.cfg = cfg
        self.cni = cni
        self.rollback = rollback
        self.detacher = detacher
        self.oplog = oplog

    async def collect_garbage(self, valid: set[str]) -> GcReport:
        """GC against `valid` pod ids; the caller holds the exclusive lock."""
        report: GcReport = {"deleted": [], "rolledBack": [], "errors": []}
        for intent in self.rollback.intents.load_all():
            record = OpRecord("gc-rollback", PodInfo(intent.pod_id))
            errors = await self.rollback.undo(intent, record)
            for failure in errors:
                record.fail(failure.error)
            self.oplog.emit(record)
            if errors:
                report["errors"] += [f"rollback of pod {intent.pod_id}: {e}" for e in errors]
            else:
                report["rolledBack"].append(intent.pod_id)
        for pod_id, entries in by_pod(self.cni.cache.entries()).items():
            if pod_id in valid and not all_netns_gone(entries):
                continue
            record = OpRecord("gc-del", pod_of(entries[0]))
            for entry in reversed(attach_order(entries)):
                name = f"{entry.network_name}/{entry.container_id}/{entry.ifname}"
                try:
                    await self.rollback.delete_entry(entry)
                    report["deleted"].append(name)
                except NriCniError as exc:
                    report["errors"].append(f"DEL {name}: {exc}")
                    record.fail(exc)
                record.step(entry.network_name, entry.ifname, "del")
            self.oplog.emit(record)
        valid_attachments: dict[str, list[Attachment]] = {}
        for entry in self.cni.cache.entries():
            valid_attachments.setdefault(entry.network_name, []).append(
                Attachment(entry.container_id, entry.ifname)
            )
        for spec in self.cfg.networks:
            try:
                await self.cni.gc(spec.conflist, valid_attachments.get(spec.name, []))
            except NriCniError as exc:
                report["errors"].append(f"GC {spec.name}: {exc}")
        self.detacher.attachments_gone()
        log.info(
            "gc: %d attachment(s) deleted, %d rollback(s) finished, %d error(s)",
            len(report["deleted"]),
            len(report["rolledBack"]),
            len(report["errors"]),
        )
        for err in report["errors"]:
            log.error("gc: %s", err)
        return report

    def reap_candidates(self) -> list[str]:
        """Pods whose every recorded netns path is gone (a stat per pod: cheap)."""
        return [
            pod_id for pod_id, entries in by_pod(self.cni.cache.entries()).items() if all_netns_gone(entries)
        ]

    async def reap(self, pod_id: str) -> bool:
        """Detaches the pod if its netns is still gone; the caller holds the pod's lock.
        True when it was detached completely."""
        entries = self.cni.cache.entries(container_id=pod_id)
        if not entries or not all_netns_gone(entries):
            return False  # attached again meanwhile, or already detached
        record = OpRecord("reap", pod_of(entries[0]))
        errors = await self.detacher.detach(record.pod, record)
        for failure in errors:
            record.fail(failure.error)
        self.oplog.emit(record)
        if errors:
            log.error(
                "reaper: pod %s (netns gone): DEL failed, GC retries: %s",
                record.pod.label(),
                "; ".join(map(str, errors)),
            )
            return False
        log.info("reaper: detached pod %s, whose netns %s is gone", record.pod.label(), entries[0].netns)
        return True

    async def recover(self, intent: Intent) -> None:
        """Start-up: roll back one ADD a crash interrupted (a failing rollback keeps its record,
        retried by the pod's DEL and by GC); the caller holds the pod's lock."""
        record = OpRecord("recover", PodInfo(intent.pod_id))
        errors = await self.rollback.undo(intent, record, op="recover")
        for failure in errors:
            record.fail(failure.error)
        self.oplog.emit(record)
        if errors:
            log.warning(
                "recovery: could not yet roll back the interrupted ADD of pod %s (%d of %d network(s) left)",
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

    def sweep_cache_temp_files(self) -> None:
        """Drop the cache's temp files a crash in the middle of a cache write left behind
        (fsutil.write_atomic's; only this process writes nri-cni's cache dir, and at start-up
        nothing is being written yet)."""
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


def all_netns_gone(entries: list[CacheEntry]) -> bool:
    paths = {e.netns for e in entries if e.netns}
    return bool(paths) and all(netns_gone(p) for p in paths)


def by_pod(entries: list[CacheEntry]) -> dict[str, list[CacheEntry]]:
    out: dict[str, list[CacheEntry]] = {}
    for entry in entries:
        out.setdefault(entry.container_id, []).append(entry)
    return out


def pod_of(entry: CacheEntry) -> PodInfo:
    """The pod a cache entry belongs to, named from the CNI_ARGS it was added with."""
    args = dict(entry.cni_args)
    return PodInfo(
        id=entry.container_id, name=args.get(K8S_POD_NAME, ""), namespace=args.get(K8S_POD_NAMESPACE, "")
    )
