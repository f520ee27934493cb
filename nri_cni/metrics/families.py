"""What nri-cni's metrics collect and how they render: Prometheus's own client library.

The serving (HTTP on a unix socket or 127.0.0.1, connection limits) is nri_cni/metrics/endpoint.py;
this module only observes and renders, so either can change without the other. Names are
stable (dashboards use them); each counter is rendered without the `_created` series, as
before. Per network and verb (add, finalize, del), `nri_cni_network_operation_duration_seconds`
is a histogram of that network's part of each pod operation.

What is measured comes from the pod plan's OpRecord (nri_cni/pod/plan.py), handed over when an
operation ends, and from GC reports; the number of attachments is read when scraped.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from nri_cni import __version__

log = logging.getLogger("nri_cni.metrics")

# nri-cni never had `_created` series; keep the exposition what dashboards already read
disable_created_metrics()

# Seconds. Pod operations run CNI chains: tens of milliseconds for a fast ADD, hundreds for
# a DEL (iptables, veth deletion), seconds for DHCP or a plugin near its timeout.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# What the runtime waits for an NRI answer: its deadline is 2 s by default, so the buckets are
# fine around it (an alert on the share above 1 s says the deadline is near).
NRI_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# How far back nri_cni_nri_request_slowest_recent_seconds looks, and how many answers it keeps.
RECENT_WINDOW = 300.0
RECENT_KEPT = 4096
# The labels a request's method or verb may take: anything else counts as "other" (the shim's
# CNI_COMMAND comes from whoever runs it; a label must never grow with input).
NRI_METHODS = frozenset(
    {
        "Configure",
        "Synchronize",
        "Shutdown",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "CreateContainer",
        "StateChange",
    }
)
SHIM_VERBS = frozenset({"ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"})


class _Attachments:
    """A collector asked at every scrape: how many attachments the cache holds."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterator[Metric]:
        try:
            held = int(self._count())
        except Exception as exc:
            log.warning("metrics: cannot count attachments: %s", exc)
            return
        yield GaugeMetricFamily(
            "nri_cni_attachments", "Network attachments nri-cni holds (cache entries).", value=held
        )


class _RecentNri:
    """A collector asked at every scrape: the slowest NRI answer of the last RECENT_WINDOW
    seconds, beside the runtime's deadline for it (0 before the runtime said one). Of the
    answers it keeps only those no later answer is as slow as (each the slowest from its time
    on), and none older than the window: a few, however many requests come."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.answers: deque[tuple[float, float]] = deque(maxlen=RECENT_KEPT)  # (when, seconds)
        self.deadline = 0.0

    def add(self, seconds: float) -> None:
        now = self.clock()
        self._expire(now)
        while self.answers and self.answers[-1][1] <= seconds:
            self.answers.pop()
        self.answers.append((now, seconds))

    def slowest(self) -> float:
        self._expire(self.clock())
        return self.answers[0][1] if self.answers else 0.0

    def _expire(self, now: float) -> None:
        while self.answers and self.answers[0][0] < now - RECENT_WINDOW:
            self.answers.popleft()

    def collect(self) -> Iterator[Metric]:
        slowest = self.slowest()
        yield GaugeMetricFamily(
            "nri_cni_nri_request_slowest_recent_seconds",
            f"The slowest NRI answer of the last {RECENT_WINDOW:.0f} s (0: none).",
            value=slowest,
        )
        yield GaugeMetricFamily(
            "nri_cni_nri_request_timeout_seconds",
            "The runtime's deadline for an NRI answer (its Configure request, else nri.request_timeout, else 2 s).",
            value=self.deadline,
        )


class Exposition:
    """nri-cni's metrics in their own registry (never the process-global one: a test or an
    embedding program may build several)."""

    def __init__(
        self,
        attachments: Callable[[], int] | None = None,
        *,
        error_code: Callable[[Any], str],
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self._error_code = error_code
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        Gauge("nri_cni_build_info", "The running nri-cni's version.", ("version",), registry=reg).labels(
            __version__
        ).set(1)
        Gauge(
            "nri_cni_start_time_seconds",
            "When the metrics started, in seconds since the epoch.",
            registry=reg,
        ).set(round(time.time(), 3))
        if attachments is not None:
            reg.register(_Attachments(attachments))

        def histogram(
            name: str, doc: str, labels: tuple[str, ...], edges: Sequence[float] = buckets
        ) -> Histogram:
            return Histogram(name, doc, labels, buckets=edges, registry=reg)

        self.pod_duration = histogram(
            "nri_cni_pod_operation_duration_seconds",
            "Duration of pod operations (add: attach every network of a pod; del: detach them).",
            ("op",),
        )
        self.network_duration = histogram(
            "nri_cni_network_operation_duration_seconds",
            "Duration of one network's part of a pod operation (add, finalize, del).",
            ("op", "network"),
        )
        self.operations = Counter(
            "nri_cni_pod_operations", "Pod operations by result (ok, error).", ("op", "result"), registry=reg
        )
        self.failures = Counter(
            "nri_cni_pod_operation_failures",
            "Failed pod operations by CNI error code (unknown: no code, e.g. a refused annotation).",
            ("op", "code"),
            registry=reg,
        )
        self.rollbacks = Counter(
            "nri_cni_network_rollbacks",
            "Networks deleted again after a later step of their pod's ADD failed.",
            ("network",),
            registry=reg,
        )
        self.gc_runs = Counter("nri_cni_gc_runs", "Garbage collection runs.", registry=reg)
        self.gc_deleted = Counter(
            "nri_cni_gc_deleted_attachments",
            "Attachments deleted by garbage collection (pods the runtime no longer has).",
            registry=reg,
        )
        self.gc_errors = Counter(
            "nri_cni_gc_errors", "Errors reported by garbage collection runs.", registry=reg
        )
        self.nri_duration = histogram(
            "nri_cni_nri_request_duration_seconds",
            "Time from an NRI request's arrival to nri-cni's answer, by method: what the runtime waits.",
            ("method",),
            NRI_BUCKETS,
        )
        self.shim_duration = histogram(
            "nri_cni_shim_request_duration_seconds",
            "Time from a shim request's arrival to nri-cni's answer, by CNI verb: what the runtime's CNI call waits.",
            ("verb",),
        )
        self.plugin_duration = histogram(
            "nri_cni_plugin_duration_seconds",
            "One CNI plugin call in a pod operation, by plugin type and verb (ADD, DEL, CHECK, FINALIZE).",
            ("plugin", "verb"),
        )
        self._recent = _RecentNri()
        reg.register(self._recent)

        self._children: dict[tuple, Any] = {}

    def _child(self, metric, *labels: str):
        """`metric.labels(...)`, kept: the pod path then skips the library's label checks."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_operation(self, record) -> None:
        """One pod operation (an OpRecord), when it ended."""
        op = record.op
        self._child(self.pod_duration, op).observe(max(0.0, time.time() - record.started))
        for step in record.networks:
            name = str(step.get("network", ""))
            if step.get("op") == "rollback":
                self._child(self.rollbacks, name).inc()
            ms = step.get("ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                self._child(self.network_duration, str(step.get("op", op)), name).observe(ms / 1000.0)
        for call in record.plugins:
            ms = call.get("ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                plugin, verb = str(call.get("plugin", "")), str(call.get("command", ""))
                self._child(self.plugin_duration, plugin, verb).observe(ms / 1000.0)
        self._child(self.operations, op, "error" if record.error else "ok").inc()
        if record.error:
            self._child(self.failures, op, self._error_code(record)).inc()

    def observe_nri(self, method: str, seconds: float, deadline: float) -> None:
        """One NRI request answered after `seconds`; `deadline`: the runtime's, as now known."""
        label = method if method in NRI_METHODS else "other"
        self._child(self.nri_duration, label).observe(seconds)
        self._recent.add(seconds)
        self._recent.deadline = deadline

    def observe_shim(self, verb: str, seconds: float) -> None:
        """One shim request (a CNI verb the runtime ran) answered after `seconds`."""
        self._child(self.shim_duration, verb if verb in SHIM_VERBS else "other").observe(seconds)

    def observe_gc(self, report: dict) -> None:
        """One GC run's report: {"deleted": [...], "errors": [...]} (PodPlan.collect_garbage)."""
        self.gc_runs.inc()
        self.gc_deleted.inc(len(report.get("deleted") or ()))
        self.gc_errors.inc(len(report.get("errors") or ()))

    def render(self) -> str:
        """The text exposition format 0.0.4."""
        return generate_latest(self.registry).decode()
