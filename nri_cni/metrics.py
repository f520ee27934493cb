"""Optional Prometheus metrics: a text endpoint on a unix socket or 127.0.0.1:PORT.

Off unless `metrics.listen` is set in the config. No client library: the exposition format
(text 0.0.4) is a few lines of text, and the server is a minimal HTTP/1.1 responder for
`GET /metrics` (and HEAD) on asyncio, one request per connection.

What is measured comes from the pod plan's OpRecord (nri_cni/pod/oprecord.py), handed over
by the plan (Metrics is its OperationSink), and from GC reports; the number of attachments is
read when scraped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from nri_cni import __version__, metrics_server
from nri_cni.errors import NriCniError


class Operation(Protocol):
    """What the metrics read of one pod operation (the pod plan's OpRecord)."""

    op: str
    started: float
    networks: list[dict]
    error: NriCniError | None


log = logging.getLogger(__name__)

# Seconds. Pod operations run CNI chains: tens of milliseconds for a fast ADD, hundreds for
# a DEL (iptables, veth deletion), seconds for DHCP or a plugin near its timeout.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_TIMEOUT = 10.0
MAX_HEADER_LINES = 100


def error_code(record: Operation) -> str:
    """The CNI error code of a failed operation's first error, as a label value ("unknown"
    if it has none). Read from the error object, never from its text."""
    return str(record.error.cni_code) if record.error is not None else "unknown"


class _Histogram:
    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self.buckets = tuple(buckets)
        self.series: dict[tuple[str, ...], list] = {}  # labels -> [bucket counts, sum, count]

    def observe(self, label_values: Sequence[str], value: float) -> None:
        key = tuple(label_values)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [[0] * len(self.buckets), 0.0, 0]
        counts = series[0]
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        series[1] += value
        series[2] += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for key in sorted(self.series):
            counts, total, count = self.series[key]
            pairs = list(zip(self.labels, key))
            for bound, n in zip(self.buckets, counts):
                yield f"{self.name}_bucket{_labels(pairs + [('le', _number(bound))])} {n}"
            yield f"{self.name}_bucket{_labels(pairs + [('le', '+Inf')])} {count}"
            yield f"{self.name}_sum{_labels(pairs)} {_number(total)}"
            yield f"{self.name}_count{_labels(pairs)} {count}"


class _Counter:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name  # without the _total suffix
        self.help = help_text
        self.labels = tuple(labels)
        self.values: dict[tuple[str, ...], float] = {}
        if not self.labels:
            self.values[()] = 0  # a plain counter exists from the start, at 0

    def inc(self, label_values: Sequence[str] = (), amount: float = 1) -> None:
        key = tuple(label_values)
        self.values[key] = self.values.get(key, 0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name}_total {self.help}"
        yield f"# TYPE {self.name}_total counter"
        for key in sorted(self.values):
            yield f"{self.name}_total{_labels(list(zip(self.labels, key)))} {_number(self.values[key])}"


def _labels(pairs: list[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


class Metrics:
    """nri-cni's metrics. `attachments` is called on every scrape (number of attachments held).

    Wiring (nri_cni/daemon/app.py build_daemon): the pod plan's OperationSink
    (`observe_operation` per pod operation, `observe_gc(report)` after each GC);
    `serve(cfg.metrics_listen)` at start when set, `close()` at stop.
    """

    def __init__(self, attachments: Callable[[], int] | None = None) -> None:
        self._attachments = attachments
        self._started = time.time()
        self.pod_duration = _Histogram(
            "nri_cni_pod_operation_duration_seconds",
            "Duration of pod operations (add: attach every network of a pod; del: detach them).",
            ("op",),
        )
        self.network_duration = _Histogram(
            "nri_cni_network_operation_duration_seconds",
            "Duration of one network's part of a pod operation (add, finalize, del).",
            ("op", "network"),
        )
        self.operations = _Counter(
            "nri_cni_pod_operations", "Pod operations by result (ok, error).", ("op", "result")
        )
        self.failures = _Counter(
            "nri_cni_pod_operation_failures",
            "Failed pod operations by CNI error code (unknown: no code, e.g. a refused annotation).",
            ("op", "code"),
        )
        self.rollbacks = _Counter(
            "nri_cni_network_rollbacks",
            "Networks deleted again after a later step of their pod's ADD failed.",
            ("network",),
        )
        self.gc_runs = _Counter("nri_cni_gc_runs", "Garbage collection runs.")
        self.gc_deleted = _Counter(
            "nri_cni_gc_deleted_attachments",
            "Attachments deleted by garbage collection (pods the runtime no longer has).",
        )
        self.gc_errors = _Counter("nri_cni_gc_errors", "Errors reported by garbage collection runs.")
        self._servers: list[asyncio.base_events.Server] = []
        self._socket_paths: list[str] = []
        self._clients: set[asyncio.Task] = set()
        self.guard: Any = None  # the connection limits, once serving (nri_cni/metrics_server.py)

    # -- observations ------------------------------------------------------------------------

    def observe_operation(self, record: Operation) -> None:
        """One pod operation (an OpRecord), called when it ended."""
        op = record.op
        self.pod_duration.observe((op,), max(0.0, time.time() - record.started))
        for step in record.networks:
            name = str(step.get("network", ""))
            if step.get("op") == "rollback":
                self.rollbacks.inc((name,))
            ms = step.get("ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                self.network_duration.observe((str(step.get("op", op)), name), ms / 1000.0)
        self.operations.inc((op, "error" if record.error is not None else "ok"))
        if record.error is not None:
            self.failures.inc((op, error_code(record)))

    def observe_gc(self, report: dict) -> None:
        """One GC run's report: {"deleted": [...], "errors": [...]} (PodPlan.collect_garbage)."""
        self.gc_runs.inc()
        self.gc_deleted.inc(amount=len(report.get("deleted") or ()))
        self.gc_errors.inc(amount=len(report.get("errors") or ()))

    # -- exposition --------------------------------------------------------------------------

    def render(self) -> str:
        lines = [
            "# HELP nri_cni_build_info The running nri-cni's version.",
            "# TYPE nri_cni_build_info gauge",
            f'nri_cni_build_info{{version="{_escape(__version__)}"}} 1',
            "# HELP nri_cni_start_time_seconds When the metrics started, in seconds since the epoch.",
            "# TYPE nri_cni_start_time_seconds gauge",
            f"nri_cni_start_time_seconds {_number(round(self._started, 3))}",
        ]
        if self._attachments is not None:
            try:
                held = int(self._attachments())
            except Exception as exc:
                log.warning("metrics: cannot count attachments: %s", exc)
            else:
                lines += [
                    "# HELP nri_cni_attachments Network attachments nri-cni holds (cache entries).",
                    "# TYPE nri_cni_attachments gauge",
                    f"nri_cni_attachments {held}",
                ]
        for metric in (
            self.pod_duration,
            self.network_duration,
            self.operations,
            self.failures,
            self.rollbacks,
            self.gc_runs,
            self.gc_deleted,
            self.gc_errors,
        ):
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"

    # -- HTTP --------------------------------------------------------------------------------

    async def serve(self, listen: str, limits: Any = None) -> asyncio.base_events.Server:
        """Listens on a unix socket path or HOST:PORT (127.0.0.1, localhost, [::1]); `limits`
        (max_connections, timeout) bound the connections (nri_cni/metrics_server.py)."""
        handle, self.guard = metrics_server.guard(self._handle, limits)
        metrics_server.limit_accept_errors(asyncio.get_running_loop())
        if listen.startswith("/"):
            _remove_stale_socket(listen)
            os.makedirs(os.path.dirname(listen) or "/", mode=0o755, exist_ok=True)
            server = await asyncio.start_unix_server(handle, path=listen)
            os.chmod(listen, 0o660)
            self._socket_paths.append(listen)
        else:
            host, _, port = listen.rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            if not port.isdigit():
                raise ValueError(f"metrics listen address {listen!r}: HOST:PORT or a socket path")
            server = await asyncio.start_server(handle, host=host, port=int(port))
        self._servers.append(server)
        log.info("metrics on %s", _where(server, listen))
        return server

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._clients):
            task.cancel()  # a scraper that connected and went quiet does not hold up the stop
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for path in self._socket_paths:
            _remove_stale_socket(path)
        self._socket_paths.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            try:
                method, target = await asyncio.wait_for(_read_request(reader), REQUEST_TIMEOUT)
            except (ValueError, asyncio.LimitOverrunError):
                await _respond(writer, 400, "Bad Request", b"bad request\n")
                return
            path = target.split("?", 1)[0]
            if path != "/metrics":
                await _respond(writer, 404, "Not Found", b"not found: try /metrics\n")
            elif method not in ("GET", "HEAD"):
                await _respond(
                    writer, 405, "Method Not Allowed", b"GET or HEAD only\n", extra=[("Allow", "GET, HEAD")]
                )
            else:
                body = self.render().encode()
                await _respond(writer, 200, "OK", body, content_type=CONTENT_TYPE, head_only=method == "HEAD")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    line = await reader.readline()
    if not line:
        raise asyncio.IncompleteReadError(b"", None)
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("not an HTTP/1.x request line")
    for _ in range(MAX_HEADER_LINES):
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            return parts[0], parts[1]
    raise ValueError("too many header lines")


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    head_only: bool = False,
    extra: Sequence[tuple[str, str]] = (),
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        *extra,
    ]
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    writer.write(head.encode("latin-1") + (b"" if head_only else body))
    await writer.drain()


def _remove_stale_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _where(server: asyncio.base_events.Server, listen: str) -> str:
    if listen.startswith("/"):
        return listen
    host, port = server.sockets[0].getsockname()[:2]
    return f"{host}:{port}"
