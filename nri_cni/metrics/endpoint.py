"""Optional Prometheus metrics: a text endpoint on a unix socket or 127.0.0.1:PORT.

Off unless `metrics.listen` is set in the config. What is collected and how it renders is
nri_cni/metrics/families.py (prometheus_client); this module serves it: a minimal HTTP/1.1 responder
for `GET /metrics` (and HEAD) on asyncio, one request per connection.

What is measured comes from the pod plan's OpRecord (nri_cni/pod/oprecord.py), handed over
by the plan (Metrics is its OperationSink), and from GC reports; the number of attachments and
the pods by their verify verdict (ok, repaired, broken: docs/reliability.md) are read when scraped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import Counter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from nri_cni.errors import NriCniError
from nri_cni.metrics import limits as metrics_server
from nri_cni.metrics.families import CONTENT_TYPE, LATENCY_BUCKETS, Exposition

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Metrics", "Operation", "error_code"]


class Operation(Protocol):
    """What the metrics read of one pod operation (the pod plan's OpRecord)."""

    op: str
    started: float
    networks: list[dict]
    error: NriCniError | None


log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0
POD_STATES = ("ok", "repaired", "broken")  # every value is exported, 0 included (alerts on broken > 0)
REPAIR_OP = "repair"  # the operation record of one repair (DEL + ADD with the same IPs + FINALIZE)
MAX_HEADER_LINES = 100


def error_code(record: Operation) -> str:
    """The CNI error code of a failed operation's first error, as a label value ("unknown"
    if it has none). Read from the error object, never from its text."""
    return str(record.error.cni_code) if record.error is not None else "unknown"


class Metrics:
    """nri-cni's metrics. `attachments` is called on every scrape (number of attachments held).

    Wiring (nri_cni/daemon/app.py build_daemon): the pod plan's OperationSink
    (`observe_operation` per pod operation, `observe_gc(report)` after each GC);
    `serve(cfg.metrics_listen)` at start when set, `close()` at stop.
    """

    def __init__(
        self,
        attachments: Callable[[], int] | None = None,
        *,
        pod_states: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """`pod_states` (state -> pods: the HealthBook's counts) is asked at every scrape."""
        # what is collected and rendered: nri_cni/metrics/families.py (prometheus_client)
        self.exposition = Exposition(attachments, error_code=error_code)
        self.attachments = attachments  # the count a scrape reads (a BackgroundValue in the daemon)
        self._servers: list[asyncio.base_events.Server] = []
        self._socket_paths: list[str] = []
        self._clients: set[asyncio.Task] = set()
        self.guard: Any = None  # the connection limits, once serving (nri_cni/metrics/limits.py)
        self._accept_errors = metrics_server.AcceptErrorFilter()
        self.repairs = Counter(
            "nri_cni_pod_repairs",
            "Repairs of a pod's networks after verify found them differ, by result (ok, error).",
            ("result",),
            registry=self.registry,
        )
        self.container_refusals = Counter(
            "nri_cni_container_refusals",
            "Values left out of a container's adjustment at NRI CreateContainer, by reason "
            "(a metadata key or value, a socket path; docs/containers.md).",
            ("reason",),
            registry=self.registry,
        )
        if pod_states is not None:
            self.registry.register(_PodStates(pod_states))

    @property
    def registry(self):
        return self.exposition.registry

    def observe_operation(self, record: Operation) -> None:
        """One pod operation (an OpRecord), called when it ended."""
        self.exposition.observe_operation(record)
        if record.op == REPAIR_OP:
            self.repairs.labels("error" if record.error else "ok").inc()

    def count_container_refusal(self, reason: str) -> None:
        """One value left out of a container's adjustment (nri_cni/daemon/containers.py)."""
        self.container_refusals.labels(reason).inc()

    def observe_nri_request(self, method: str, seconds: float, deadline: float) -> None:
        """One NRI request answered (the stub's observer): per method, and against the deadline."""
        self.exposition.observe_nri(method, seconds, deadline)

    def observe_shim_request(self, verb: str, seconds: float) -> None:
        """One shim request answered (the local server's observer), per CNI verb."""
        self.exposition.observe_shim(verb, seconds)

    def observe_gc(self, report: dict) -> None:
        """One GC run's report: {"deleted": [...], "errors": [...]} (PodPlan.collect_garbage)."""
        self.exposition.observe_gc(report)

    def render(self) -> str:
        return self.exposition.render()

    # -- HTTP --------------------------------------------------------------------------------

    async def serve(self, listen: str, limits: Any = None) -> asyncio.base_events.Server:
        """Listens on a unix socket path or HOST:PORT (127.0.0.1, localhost, [::1]); `limits`
        (max_connections, timeout) bound the connections (nri_cni/metrics/limits.py)."""
        handle, self.guard = metrics_server.guard(self._handle, limits)
        logging.getLogger(metrics_server.ASYNCIO_LOG).addFilter(self._accept_errors)  # once: a set
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
        logging.getLogger(metrics_server.ASYNCIO_LOG).removeFilter(self._accept_errors)
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


class _PodStates:
    """A collector asked at every scrape: pods by their last verify's verdict."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        family = GaugeMetricFamily(
            "nri_cni_pods",
            "Pods by the verdict of their last verify (ok, repaired, broken).",
            labels=("state",),
        )
        for state in POD_STATES:
            family.add_metric((state,), counts.get(state, 0))
        yield family


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
