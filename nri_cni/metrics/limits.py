"""Limits for the metrics endpoint, kept apart from what the metrics are.

Whoever can reach the metrics port can open connections and scrape as often as they like, and
the daemon that answers also runs every pod's plugins with a limited number of descriptors:
- `guard()` wraps a connection handler with a connection cap (a connection past it is closed at
  once, without reading) and one timeout for the whole exchange (reading the request and
  writing the answer: a scraper that stops reading cannot hold a connection);
- `AcceptErrorFilter`, a filter on asyncio's logger, rate-limits the event loop's "accept()
  out of system resource" reports, one line per 10 s with a count, instead of megabytes of log;
- `BackgroundValue` serves a value that is costly to compute (the number of cache entries: one
  file each) from the last computation, refreshed off the event loop at most every `max_age`
  seconds, so a scrape costs the same with 10 or 10,000 cache files.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nri_cni.safety.ratelog import RateLimitedLog

log = logging.getLogger("nri_cni.metrics")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
DEFAULT_MAX_CONNECTIONS = 16
DEFAULT_TIMEOUT = 5.0


class ConnectionGuard:
    def __init__(
        self, max_connections: int = DEFAULT_MAX_CONNECTIONS, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.max_connections = max_connections
        self.timeout = timeout
        self.open = 0
        self.refused = 0
        self._log = RateLimitedLog(log)

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self.open >= self.max_connections:
                self.refused += 1
                self._log("cap", "metrics: over %d connections; one closed", self.max_connections)
                writer.close()
                return
            self.open += 1
            try:
                await asyncio.wait_for(handler(reader, writer), self.timeout or None)
            except TimeoutError:
                writer.close()
            finally:
                self.open -= 1

        return guarded


def guard(handler: Handler, settings: Any = None) -> tuple[Handler, ConnectionGuard]:
    """`handler` behind a ConnectionGuard made from `settings` (max_connections, timeout)."""
    g = ConnectionGuard(
        getattr(settings, "max_connections", DEFAULT_MAX_CONNECTIONS),
        getattr(settings, "timeout", DEFAULT_TIMEOUT),
    )
    return g.wrap(handler), g


_ACCEPT_ERROR = "socket.accept() out of system resource"
ASYNCIO_LOG = "asyncio"  # where the event loop's default exception handler reports


class AcceptErrorFilter(logging.Filter):
    """On asyncio's logger (the metrics server adds it while it serves): the accept errors it
    reports go through a rate-limited line of ours; every other record passes. asyncio already
    pauses accepting for a second after such an error."""

    def __init__(self) -> None:
        super().__init__()
        self._limited = RateLimitedLog(log)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(_ACCEPT_ERROR):
            return True
        self._limited("accept", "%s: %s", _ACCEPT_ERROR, record.exc_info[1] if record.exc_info else "")
        return False


class BackgroundValue:
    """fn()'s last value; past `max_age` a refresh runs in a worker thread and the scrape gets
    the previous value meanwhile. The first call computes it in place."""

    def __init__(
        self, fn: Callable[[], Any], max_age: float = 15.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fn = fn
        self.max_age = max_age
        self.clock = clock
        self._value: Any = None
        self._at = -1.0
        self._refreshing = False

    def __call__(self) -> Any:
        now = self.clock()
        if self._at < 0:
            self._store(self.fn())
        elif now - self._at > self.max_age and not self._refreshing:
            self._refresh()
        return self._value

    def _store(self, value: Any) -> None:
        self._value = value
        self._at = self.clock()

    def _refresh(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._store(self.fn())
            return
        self._refreshing = True
        future = loop.run_in_executor(None, self.fn)

        def done(f: asyncio.Future) -> None:
            self._refreshing = False
            if f.cancelled() or f.exception() is not None:
                self._at = self.clock()  # retried after max_age; the old value stays
                return
            self._store(f.result())

        future.add_done_callback(done)
