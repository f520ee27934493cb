"""Upkeep: what keeps the node converging on the runtime's pods when no pod event says so.

- collect_garbage: the runtime's pod list is the truth; roll back every intent record left
  over, DEL every attachment of a pod not in the list or whose netns is gone (`gc.parallel` pods
  at a time, each under its own pod's lock: live pods are not held up, and while one's operation
  waits or runs GC starts no plugin), then, alone (the exclusive lock), the CNI GC verb for every
  network list with the attachments that remain.
- reap: a pod whose netns the runtime removed without telling us (containerd 2.1.9 sends no NRI
  stop/remove for pods that lived through its restart, containerd#8426) is detached.
- recover: at start-up, roll back every ADD a crash interrupted.

Nothing leaks (docs/reliability.md): what a pod holds is either a cache entry (a finished
attachment) or an intent record (an ADD that did not finish, or whose rollback failed); these
work through both until every DEL succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.executor import Executor
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.cni.runtime import Attachment, CNIRuntime
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import NriCniError
from nri_cni.pod.detach import Detacher, attach_order
from nri_cni.pod.intents import Intent
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE, PodInfo
from nri_cni.pod.oprecord import GcReport, OperationLog, OpRecord
from nri_cni.pod.rollback import Rollback
from nri_cni.safety import files
from nri_cni.safety.files import is_temporary
from nri_cni.safety.validate import is_valid_id

log = logging.getLogger("nri_cni.pod")

# the valid pod ids of a GC: fixed, or asked again under each stale pod's lock
Valid = set[str] | Callable[[], set[str]]
# pod id -> the runtime lists it and its pause process runs (its netns path says nothing then)
Running = Callable[[str], bool]


def _nothing_runs(pod_id: str) -> bool:
    return False


# GC's plugins run at this nice value: beside a pod's ADD they get a small share of the CPUs
# (bench_gc prints the ADD's plugin times beside a GC), alone they get all of it. Not 19: a DEL
# holding a lock an ADD needs (host-local's, iptables') must still move on a busy node.
GC_PLUGIN_NICE = 10


def gc_parallel(cfg: Config) -> int:
    """Stale pods GC detaches at once. A DEL is part CPU (starting the plugins) and part waiting
    (the kernel's RTNL, iptables' lock, IPAM files; libcni's DELs one after another keep 0.6 of
    a CPU busy): a few per CPU keep the CPUs busy; past 16 they only queue on those locks."""
    return cfg.gc_parallel or max(4, min(16, 4 * (os.cpu_count() or 1)))


def netns_gone(path: str) -> bool:
    """The netns path a runtime gave is gone (the runtime removed it: pod stopped, or node
    rebooted). False when nothing can be said: no path, or its directory is not visible here
    (a container without the host's netns dir must never conclude that every pod is gone)."""
    if not path or not os.path.isabs(path):
        return False
    return not os.path.lexists(path) and os.path.isdir(os.path.dirname(path))


def pause_alive(pid: int) -> bool:
    """The pod's pause process (NRI PodSandbox.pid) still runs, and is no zombie: it keeps the
    pod's netns alive, whatever became of the netns path. False when unknown (0), gone, or not
    visible here (a daemon without the host's PID namespace)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return stat_runs(f.read())
    except OSError:
        return False


def stat_runs(stat: bytes) -> bool:
    """A /proc/PID/stat line says its process runs: the state after the command (the last `)`:
    a command may hold spaces and parentheses) is there and is neither zombie (Z) nor dead (X)."""
    end = stat.rfind(b")")
    return end > 0 and stat[end + 2 : end + 3] not in (b"Z", b"X", b"")


class Upkeep:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        cni: CNIRuntime,
        *,
        rollback: Rollback,
        detacher: Detacher,
        oplog: OperationLog,
    ) -> None:
        self.source = ConfigSource.of(cfg)
        self.cni = cni
        self.rollback = rollback
        self.detacher = detacher
        self.oplog = oplog

    @property
    def cfg(self) -> Config:
        return self.source.current

    async def collect_garbage(
        self, valid: Valid, locks: PodLocks | None = None, *, running: Running = _nothing_runs
    ) -> GcReport:
        """GC against the valid pod ids: a set, or a function asked again under each stale pod's
        lock (an ADD may have made the pod valid meanwhile). `locks`: the service's; without
        them (tests, tools) nothing else runs and a lock set of its own serves. `running`: the
        valid pods known to run whatever became of their netns path (kept even then)."""
        current: Callable[[], set[str]] = valid if callable(valid) else lambda: valid
        if locks is None:  # (not `or`: a PodLocks holding no pod is falsy)
            locks = PodLocks()
        async with locks.gc_turn():
            report = await self._collect_pods(current, locks, running)
            # The GC verb sees every attachment of the network list: nothing may attach or
            # detach meanwhile (the CNI spec). Valid = what is cached now, so an attachment
            # made while the stale pods were DELed counts.
            async with locks.exclusive():
                report["errors"] += await self._gc_verbs()
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

    async def _collect_pods(
        self, valid: Callable[[], set[str]], locks: PodLocks, running: Running
    ) -> GcReport:
        """Roll back the intent records left and DEL the stale pods, `gc_parallel` pods at a
        time, each under its own lock only: an ADD of another pod waits for nothing."""
        # every cache file read and parsed: off the event loop, which reads pods' requests meanwhile
        cached = by_pod(await asyncio.to_thread(self.cni.cache.entries))
        snapshot = valid()
        stale = [
            pod_id
            for pod_id, entries in cached.items()
            if pod_id not in snapshot or (all_netns_gone(entries) and not running(pod_id))
        ]
        # intent records by name only: an ADD in flight may be writing its record right now
        # (its temp file is not ours to sweep; start-up recovery does that)
        intents = [p for p in self.rollback.intents.pod_ids() if is_valid_id(p)]
        candidates = list(dict.fromkeys(intents + stale))
        parallel = gc_parallel(self.cfg)
        slots = asyncio.Semaphore(parallel)
        rollback = Rollback(_gated(self.cni, locks, parallel), self.rollback.intents)
        parts: dict[str, GcReport] = {}

        async def one(pod_id: str) -> None:
            async with slots:
                # An operation in flight makes the pod valid (service/roster.py) and its own DEL or ADD
                # handles its intent record: the pod is left for the next GC rather than
                # holding a slot, and the stale pods behind it, while that operation runs.
                if locks.busy(pod_id):
                    return
                async with locks.pod(pod_id, gc=True):
                    parts[pod_id] = await self._collect_pod(pod_id, valid, rollback, running)

        async with asyncio.TaskGroup() as tasks:
            for pod_id in candidates:
                tasks.create_task(one(pod_id))
        report: GcReport = {"deleted": [], "rolledBack": [], "errors": []}
        for pod_id in candidates:  # the report in a stable order, whatever finished first
            for key, values in parts.get(pod_id, {}).items():
                report[key] += values
        return report

    async def _collect_pod(
        self, pod_id: str, valid: Callable[[], set[str]], rollback: Rollback, running: Running
    ) -> GcReport:
        """One pod, under its lock: its left-over intent record, then its DELs if still stale."""
        report: GcReport = {"deleted": [], "rolledBack": [], "errors": []}
        intent = rollback.intents.load(pod_id)
        if intent is not None:
            record = OpRecord("gc-rollback", PodInfo(intent.pod_id))
            errors = await rollback.undo(intent, record)
            for failure in errors:
                record.fail(failure.error)
            self.oplog.emit(record)
            if errors:
                report["errors"] += [f"rollback of pod {intent.pod_id}: {e}" for e in errors]
            else:
                report["rolledBack"].append(intent.pod_id)
        entries = self.cni.cache.entries(container_id=pod_id)
        if not entries or (pod_id in valid() and (running(pod_id) or not all_netns_gone(entries))):
            return report  # detached meanwhile, or valid again: an ADD came, the runtime lists it
        record = OpRecord("gc-del", pod_of(entries[0]))
        for entry in reversed(attach_order(entries)):
            name = f"{entry.network_name}/{entry.container_id}/{entry.ifname}"
            try:
                await rollback.delete_entry(entry, observe=record)
                report["deleted"].append(name)
            except NriCniError as exc:
                report["errors"].append(f"DEL {name}: {exc}")
                record.fail(exc)
            record.step(entry.network_name, entry.ifname, "del")
        self.oplog.emit(record)
        return report

    async def _gc_verbs(self) -> list[str]:
        """The CNI GC verb of every network list, the cached attachments as the valid ones;
        the lists at once (independent plugins), so the exclusive section lasts the longest."""
        valid_attachments: dict[str, list[Attachment]] = {}
        for entry in await asyncio.to_thread(self.cni.cache.entries):  # as _collect_pods
            valid_attachments.setdefault(entry.network_name, []).append(
                Attachment(entry.container_id, entry.ifname)
            )
        specs = list(self.cfg.networks)
        outcomes = await asyncio.gather(
            *(self.cni.gc(spec.conflist, valid_attachments.get(spec.name, [])) for spec in specs),
            return_exceptions=True,
        )
        errors = []
        for spec, outcome in zip(specs, outcomes, strict=True):
            if isinstance(outcome, NriCniError):
                errors.append(f"GC {spec.name}: {outcome}")
            elif isinstance(outcome, BaseException):
                raise outcome
        return errors

    async def reap_candidates(self) -> list[str]:
        """Pods whose every recorded netns path is gone (a stat per pod). Read in a thread, as
        GC's listing: reading and parsing every cache entry held the event loop (and the pod
        requests that came meanwhile) 2.9 ms at 40 pods, 41 ms at 500, every status interval."""

        def candidates() -> list[str]:
            return [
                pod_id
                for pod_id, entries in by_pod(self.cni.cache.entries()).items()
                if all_netns_gone(entries)
            ]

        return await asyncio.to_thread(candidates)

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

    def sweep_cache_leftovers(self) -> None:
        """Drop the cache's temp files a crash in the middle of a cache write left behind
        (fsutil.write_atomic's; only this process writes nri-cni's cache dir, and at start-up
        nothing is being written yet), and the entries deleted but not yet unlinked."""
        files.empty(self.cni.cache.deleted_dir)
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


class _GcExecutor:
    """GC's plugin execs: the runtime's executor, each exec through the locks' GC slots (while a
    pod operation waits or runs, GC starts no plugin, so a pod's ADD shares the CPUs and the
    kernel's locks only with the plugins GC had already started), and at GC_PLUGIN_NICE. It
    wraps any Executor and is one."""

    def __init__(self, inner: Executor, locks: PodLocks, parallel: int) -> None:
        self.inner = inner
        self.locks = locks
        self.parallel = parallel

    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        return self.inner.find(plugin_type, bin_dirs)

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        async with self.locks.gc_slot(self.parallel):
            PLUGIN_NICE.set(GC_PLUGIN_NICE)  # this task's: the pods' own plugins keep 0
            return await self.inner.exec(plugin_path, env, stdin, timeout)


def _gated(cni: CNIRuntime, locks: PodLocks, parallel: int) -> CNIRuntime:
    """The same runtime (cache, bin dirs...), its plugins exec'd through GC's slots."""
    return cni.with_executor(_GcExecutor(cni.executor, locks, parallel))


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
