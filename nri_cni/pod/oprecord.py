"""The record of one pod operation: what it did, how long each step took, its first error.

One structured log line per operation (logger `nri_cni.podop`, read by tests and benches) and
one observation for the metrics (an OperationSink, nri_cni/pod/seams.py).

`marks` name instants inside an operation, in ms from its start (`at`): those before it, from
`arrival()` (the local server's "accepted", "read", "decoded" of a shim request), are negative.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from nri_cni.cni.runtime import PluginCall
from nri_cni.errors import NriCniError
from nri_cni.pod.model import PodInfo

oplog = logging.getLogger("nri_cni.podop")  # one structured line per pod operation

# The instants (time.perf_counter()) a request passed before its operation began, by name: set by
# whoever received it, in the context (task) that runs the operation.
_arrival: ContextVar[dict[str, float] | None] = ContextVar("nri_cni_arrival", default=None)

# What a GC run did: {"deleted": [...], "rolledBack": [...], "errors": [...]}, as the CLI shows it.
GcReport = dict[str, list[str]]


@dataclass(frozen=True)
class NetworkFailure:
    """One network's DEL (or rollback) that failed: its state stays for the next try."""

    network: str
    error: NriCniError

    def __str__(self) -> str:
        return f"network {self.network!r}: {self.error}"


@dataclass
class OpRecord:
    """What one pod operation did, for the log line and the metrics."""

    op: str
    pod: PodInfo
    started: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)  # the same instant, for step offsets
    networks: list[dict[str, Any]] = field(default_factory=list)
    plugins: list[dict[str, Any]] = field(default_factory=list)
    error: NriCniError | None = None  # the first failure; its kind and codes feed the metrics
    failures: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # op-specific fields (a repair: "wrong", "asked")
    marks: dict[str, float] = field(default_factory=dict)  # named instants, ms from t0

    def __post_init__(self) -> None:
        for name, at in (_arrival.get() or {}).items():
            self.marks[name] = round((at - self.t0) * 1000, 2)

    def mark(self, name: str) -> None:
        """An instant inside the operation worth naming in its timeline."""
        self.marks[name] = ms_since(self.t0)

    def plugin_done(self, call: PluginCall) -> None:
        """The CNI runtime's observer: one plugin call of this operation succeeded."""
        self.plugins.append(call.to_dict())

    def fail(self, exc: NriCniError) -> None:
        """One more failure of this operation; the first one is kept."""
        if self.error is None:
            self.error = exc
        self.failures += 1

    def step(self, network: str, ifname: str, op: str, t0: float | None = None) -> None:
        """One network's step; `t0` (time.perf_counter() at its start) adds when it started
        (`at`, ms into the operation: networks ADDed at once overlap) and its duration."""
        entry: dict[str, Any] = {"network": network, "ifname": ifname, "op": op}
        if t0 is not None:
            entry["at"] = round((t0 - self.t0) * 1000, 2)
            entry["ms"] = ms_since(t0)
        self.networks.append(entry)

    def emit(self) -> None:
        ended = time.time()
        line: dict[str, Any] = {
            "op": self.op,
            "pod": self.pod.label(),
            "podId": self.pod.id,
            "start": round(self.started, 6),
            "end": round(ended, 6),
            "ms": round((ended - self.started) * 1000, 2),
            "networks": self.networks,
            "plugins": self.plugins,
            "result": "error" if self.error is not None else "ok",
            **({"marks": self.marks} if self.marks else {}),
            **self.extra,
        }
        if self.error is not None:
            line["error"] = str(self.error)
            if self.failures > 1:
                line["failures"] = self.failures
        oplog.info(json.dumps(line, separators=(",", ":")))


def arrival(stamps: dict[str, float]) -> None:
    """The current request's instants before its operation (time.perf_counter(), by name): the
    operation records of this context take them as negative marks."""
    _arrival.set(stamps)


def ms_since(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


class OperationSink(Protocol):
    """Where finished pod operations and GC runs are reported (nri_cni.metrics.Metrics)."""

    def observe_operation(self, record: OpRecord) -> None: ...

    def observe_gc(self, report: GcReport) -> None: ...


class NoSink:
    """An OperationSink that keeps nothing (tests, tools)."""

    def observe_operation(self, record: OpRecord) -> None:
        return None

    def observe_gc(self, report: GcReport) -> None:
        return None


@dataclass(frozen=True)
class FreshAdd:
    """A pod whose last operation is an ADD that succeeded: when it ended (the log's clock),
    the netns it used and its attachments (network, ifname)."""

    ended: float
    netns: str
    attachments: frozenset[tuple[str, str]]


class OperationLog:
    """Ends pod operations: the plugins' timings, the log line, the sink. Keeps, per pod whose
    last operation is a successful ADD, that ADD (`fresh`): any later operation on the pod
    that is recorded (a CHECK, DEL, repair, GC, or a failure) takes it away."""

    def __init__(self, sink: OperationSink, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.clock = clock
        self.fresh: dict[str, FreshAdd] = {}

    def emit(self, record: OpRecord) -> None:
        record.emit()
        pod_id = record.pod.id
        added = frozenset((n["network"], n["ifname"]) for n in record.networks if n["op"] == "add")
        if record.op == "add" and record.error is None and added:
            self.fresh[pod_id] = FreshAdd(self.clock(), record.pod.netns, added)
        else:
            self.fresh.pop(pod_id, None)
        self.sink.observe_operation(record)
