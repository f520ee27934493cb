"""Log lines about what outsiders do (refused connections, accept errors), at a bounded rate:
one line per key per `every` seconds, the lines left out counted in the next one. A client that
opens thousands of connections must not also fill the disk with their log."""

from __future__ import annotations

import logging
import time

LOG_EVERY = 10.0


class RateLimitedLog:
    """One log line per `every` seconds per key; the lines left out are counted in the next."""

    def __init__(self, logger: logging.Logger, every: float = LOG_EVERY) -> None:
        self.log = logger
        self.every = every
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def __call__(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -self.every) < self.every:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return
        dropped = self._dropped.pop(key, 0)
        self._last[key] = now
        suffix = f" ({dropped} more like it not logged)" if dropped else ""
        self.log.error(msg + suffix, *args)
