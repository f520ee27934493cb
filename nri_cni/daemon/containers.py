"""The pod's networks in its containers: NRI CreateContainer's adjustment and the status files.

At CreateContainer (every mode) `ContainerNetworks.adjust` reads the pod's attachments (nri-cni's
cache; in secondary mode the runtime's eth0 too), decides with `container_adjustment`
(adjust.py), writes the pod's status file atomically before answering, logs what it refused
once per pod and counts it. The per-pod directory, `<state_dir>/containers/<pod id>/`, is
mounted, not the file: a rewrite (the file is replaced by a rename) shows in running containers.

It is also an OperationSink beside the metrics (daemon/app.py): after a pod's add or repair its
file, if the pod has one, is written again; after the pod's DEL (stop, GC, reaper) its
directory goes. RemovePodSandbox forgets the pod, and every Synchronize removes the
directories of pods neither listed nor attached (a pod removed while nri-cni was down).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import ConfigSource
from nri_cni.daemon import podreport
from nri_cni.daemon.adjust import STATUS_FILE, Adjustment, container_adjustment, status_json
from nri_cni.errors import NriCniError
from nri_cni.pod.oprecord import GcReport, OperationSink, OpRecord
from nri_cni.safety import files, validate

log = logging.getLogger("nri_cni.containers")

STATUS_SUBDIR = "containers"
# operations after which the pod's file is written again (if it has one), or its dir goes
REWRITE_AFTER = frozenset({"add", "repair"})
REMOVE_AFTER = frozenset({"del", "gc-del", "reap"})


@dataclass(frozen=True)
class PodEntries:
    """Where a pod's attachments are read: nri-cni's cache, and the runtime's (secondary)."""

    own: Callable[[str], list[CacheEntry]]
    runtime: Callable[[str], list[CacheEntry]]


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
        self._logged: set[str] = set()  # pods whose refusals were logged

    @property
    def root(self) -> str:
        return os.path.join(self.source.current.state_dir, STATUS_SUBDIR)

    def pod_dir(self, pod_id: str) -> str:
        validate.check_id(pod_id, "pod id")
        return files.child(self.root, pod_id)

    def build(self, pod_id: str) -> Adjustment:
        """The adjustment for a container of the pod (empty for a pod without attachments)."""
        cfg = self.source.current
        status = podreport.pod_network_status(
            self.entries.own(pod_id),
            self.entries.runtime(pod_id),
            {n.name: n.nad for n in cfg.networks if n.nad},
        )
        if not status:
            return Adjustment()
        per_network = {n.name: n.containers for n in cfg.networks}
        return container_adjustment(
            status, cfg.containers, per_network, pod_dir=self.pod_dir(pod_id), resolve=self.resolve
        )

    def adjust(self, pod_id: str, label: str) -> Adjustment:
        """CreateContainer: the adjustment, its file written, its refusals logged and counted."""
        adj = self.build(pod_id)
        for refusal in adj.refusals:
            self.count_refusal(refusal.reason)
        if adj.refusals and pod_id not in self._logged:
            self._logged.add(pod_id)
            log.warning(
                "pod %s id=%s: left out of its containers: %s",
                label,
                pod_id,
                "; ".join(
                    f"{r.interface}: {validate.quote_whole(r.what[:200])} ({r.reason})" for r in adj.refusals
                ),
            )
        if adj.status is not None:
            self._write(pod_id, adj.status)
        return adj

    def _write(self, pod_id: str, status: list[dict]) -> None:
        files.private_dir(self.root)
        directory = self.pod_dir(pod_id)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        os.chmod(directory, 0o755)  # read by the container's user through the mount
        files.write_atomic(
            os.path.join(directory, STATUS_FILE), status_json(status), durable=False, mode=0o644
        )

    def refresh(self, pod_id: str) -> None:
        """The pod's attachments changed: its file, if it has one, says so now."""
        if not os.path.isdir(self.pod_dir(pod_id)):
            return
        adj = self.build(pod_id)
        if adj.status is not None:
            self._write(pod_id, adj.status)

    def forget(self, pod_id: str) -> None:
        """The pod is gone: its directory goes (its containers are gone too)."""
        self._logged.discard(pod_id)
        shutil.rmtree(self.pod_dir(pod_id), ignore_errors=True)

    def retain(self, pod_ids: Collection[str]) -> None:
        """Removes the directory of every pod not in `pod_ids`."""
        for pod_id in self.pod_ids():
            if pod_id not in pod_ids:
                log.info("pod id=%s: gone; its containers' status directory removed", pod_id)
                self.forget(pod_id)

    def pod_ids(self) -> Iterable[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return [n for n in names if validate.is_valid_id(n)]

    # -- OperationSink ---------------------------------------------------------------------

    def observe_operation(self, record: OpRecord) -> None:
        pod_id = record.pod.id
        try:
            if record.op in REWRITE_AFTER and record.error is None:
                self.refresh(pod_id)
            elif record.op in REMOVE_AFTER:
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
