"""The pod's networks in its containers: NRI CreateContainer's adjustment and the status files.

At a pod's first CreateContainer (every mode) `ContainerNetworks.adjust` reads the pod's
attachments (nri-cni's cache; in secondary mode the runtime's eth0 too), decides with
`container_adjustment` (adjust.py), writes the pod's status file atomically before answering,
and keeps the adjustment in the pod's record (`PodAdjustment`): its next containers get it as it
is, without reading the cache again, while it is current (`still_current`: made with the config
in force, and every path it resolved still resolves the same). The pod's attachments change only
with its operations, and the record follows them (below). What the adjustment refused is logged
once per pod and counted for each container. The per-pod directory,
`<state_dir>/containers/<pod id>/`, is mounted, not the file: a rewrite (the file is replaced by
a rename) shows in running containers.

It is also an OperationSink beside the metrics (daemon/app.py), deciding with `after_operation`:
after a pod's DEL (stop, GC, reaper) its directory and record go; after a check nothing changes;
after any other operation (add, repair, a rollback) its record, if it has one or a directory, is
made again from the cache, and its file written when its content changed. RemovePodSandbox
forgets the pod, and every Synchronize forgets the pods neither listed nor attached (a pod
removed while nri-cni was down, or whose removal was missed).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config, ConfigSource
from nri_cni.daemon import podreport
from nri_cni.daemon.adjust import STATUS_FILE, Adjustment, container_adjustment, status_json
from nri_cni.errors import NriCniError
from nri_cni.pod.oprecord import GcReport, OperationSink, OpRecord
from nri_cni.safety import files, validate

log = logging.getLogger("nri_cni.containers")

STATUS_SUBDIR = "containers"
# what a pod's operation means for its containers' record and directory (after_operation)
REMOVE = "remove"  # the pod's DEL: its directory and record go
KEEP = "keep"  # nothing changed
REMAKE = "remake"  # its attachments may have changed: made again from the cache
REMOVE_AFTER = frozenset({"del", "gc-del", "reap"})
KEEP_AFTER = frozenset({"check"})


def after_operation(op: str) -> str:
    """REMOVE, KEEP or REMAKE after the pod's operation `op` (OpRecord.op), failed or not: a
    failed operation may have changed the attachments too (a repair that re-added some)."""
    if op in REMOVE_AFTER:
        return REMOVE
    if op in KEEP_AFTER:
        return KEEP
    return REMAKE


@dataclass(frozen=True)
class PodEntries:
    """Where a pod's attachments are read: nri-cni's cache, and the runtime's (secondary)."""

    own: Callable[[str], list[CacheEntry]]
    runtime: Callable[[str], list[CacheEntry]]


@dataclass
class PodAdjustment:
    """One pod's record: the adjustment its containers get, what it was made from (the config,
    each path it resolved and to what), the status file's bytes last written (None: not yet by
    this process), whether its refusals were logged."""

    config: Config
    adjustment: Adjustment
    resolved: tuple[tuple[str, str], ...] = ()
    written: bytes | None = None
    logged: bool = False


def still_current(kept: PodAdjustment, config: Config, resolve: Callable[[str], str]) -> bool:
    """The kept adjustment is the one the pod's next container gets: made with the config in
    force (a reload replaces it), every path it resolved (the socket directories' symlink
    check) resolving the same."""
    return kept.config is config and all(resolve(path) == to for path, to in kept.resolved)


class ContainerNetworks:
    def __init__(
        self,
        source: ConfigSource,
        entries: PodEntries,
        *,
        count_refusal: Callable[[str], None],
        resolve: Callable[[str], str] = os.path.realpath,
    ) -> None:
        self.source = source
        self.entries = entries
        self.count_refusal = count_refusal
        self.resolve = resolve
        self._pods: dict[str, PodAdjustment] = {}

    @property
    def root(self) -> str:
        return os.path.join(self.source.current.state_dir, STATUS_SUBDIR)

    def pod_dir(self, pod_id: str) -> str:
        validate.check_id(pod_id, "pod id")
        return files.child(self.root, pod_id)

    def build(self, pod_id: str, cfg: Config, resolve: Callable[[str], str]) -> Adjustment:
        """The adjustment for a container of the pod (empty for a pod without attachments)."""
        status = podreport.pod_network_status(
            self.entries.own(pod_id),
            self.entries.runtime(pod_id),
            {n.name: n.nad for n in cfg.networks if n.nad},
        )
        if not status:
            return Adjustment()
        per_network = {n.name: n.containers for n in cfg.networks}
        return container_adjustment(
            status, cfg.containers, per_network, pod_dir=self.pod_dir(pod_id), resolve=resolve
        )

    def adjust(self, pod_id: str, label: str) -> Adjustment:
        """CreateContainer: the pod's adjustment, its file written, its refusals logged once and
        counted."""
        kept = self._pods.get(pod_id)
        if kept is None or not still_current(kept, self.source.current, self.resolve):
            kept = self._remake(pod_id)
        adj = kept.adjustment
        for refusal in adj.refusals:
            self.count_refusal(refusal.reason)
        if adj.refusals and not kept.logged:
            kept.logged = True
            log.warning(
                "pod %s id=%s: left out of its containers: %s",
                label,
                pod_id,
                "; ".join(
                    f"{r.interface}: {validate.quote_whole(r.what[:200])} ({r.reason})" for r in adj.refusals
                ),
            )
        return adj

    def _remake(self, pod_id: str) -> PodAdjustment:
        """The pod's record made again from the cache and the config in force; its file written
        when its content changed. A failure leaves the pod without a record (the next container
        tries again). A pod id that could name a path gets none."""
        validate.check_id(pod_id, "pod id")
        old = self._pods.pop(pod_id, None)
        cfg = self.source.current
        resolved: dict[str, str] = {}

        def resolve(path: str) -> str:
            resolved[path] = self.resolve(path)
            return resolved[path]

        adj = self.build(pod_id, cfg, resolve)
        kept = PodAdjustment(
            cfg,
            adj,
            tuple(resolved.items()),
            written=None if old is None else old.written,
            logged=old is not None and old.logged,
        )
        if adj.status is not None:
            data = status_json(adj.status)
            if data != kept.written:
                self._write(pod_id, data)
                kept.written = data
        self._pods[pod_id] = kept
        return kept

    def _write(self, pod_id: str, data: bytes) -> None:
        files.private_dir(self.root)
        directory = self.pod_dir(pod_id)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        os.chmod(directory, 0o755)  # read by the container's user through the mount
        files.write_atomic(os.path.join(directory, STATUS_FILE), data, durable=False, mode=0o644)

    def refresh(self, pod_id: str) -> None:
        """The pod's attachments may have changed: its record, if it has one or a directory, is
        made again (its file, if it changed, says so now)."""
        if pod_id in self._pods or os.path.isdir(self.pod_dir(pod_id)):
            self._remake(pod_id)

    def forget(self, pod_id: str) -> None:
        """The pod is gone: its record and its directory go (its containers are gone too)."""
        self._pods.pop(pod_id, None)
        shutil.rmtree(self.pod_dir(pod_id), ignore_errors=True)

    def retain(self, pod_ids: Collection[str]) -> None:
        """Forgets every pod not in `pod_ids`."""
        on_disk = set(self.pod_ids())
        for pod_id in on_disk | set(self._pods):
            if pod_id not in pod_ids:
                if pod_id in on_disk:
                    log.info("pod id=%s: gone; its containers' status directory removed", pod_id)
                self.forget(pod_id)

    def pod_ids(self) -> Iterable[str]:
        """The pods with a status directory."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return [n for n in names if validate.is_valid_id(n)]

    # -- OperationSink ---------------------------------------------------------------------

    def observe_operation(self, record: OpRecord) -> None:
        pod_id = record.pod.id
        try:
            action = after_operation(record.op)
            if action == REMAKE:
                self.refresh(pod_id)
            elif action == REMOVE:
                self.forget(pod_id)
        except (OSError, ValueError, NriCniError) as exc:
            log.error("pod id=%s: its containers' status file: %s", pod_id, exc)

    def observe_gc(self, report: GcReport) -> None:
        return None


class OperationTee:
    """Several OperationSinks as one (the metrics and the containers' status files)."""

    def __init__(self, *sinks: OperationSink) -> None:
        self.sinks = sinks

    def observe_operation(self, record: OpRecord) -> None:
        for sink in self.sinks:
            sink.observe_operation(record)

    def observe_gc(self, report: GcReport) -> None:
        for sink in self.sinks:
            sink.observe_gc(report)
