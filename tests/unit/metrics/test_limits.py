"""The metrics endpoint's limits: accept errors are logged at a bounded rate, and a value
computed in the background is computed once per max age (tests/integration/metrics/
test_metrics_connection_cap.py holds the connection cap on a running daemon)."""

from __future__ import annotations

import asyncio
import logging

from nri_cni.metrics import limits as metrics_server
from tests.support.harness import run


def test_accept_errors_are_logged_at_a_bounded_rate(caplog):
    async def scenario():
        loop = asyncio.get_running_loop()
        metrics_server.limit_accept_errors(loop)
        handler = loop.get_exception_handler()
        for _ in range(5000):
            handler(
                loop, {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}
            )

    with caplog.at_level(logging.ERROR, logger="nri_cni.metrics"):
        run(scenario())
    lines = [r for r in caplog.records if "accept" in r.getMessage()]
    assert 1 <= len(lines) <= 2, len(lines)


def test_background_value_is_computed_once_per_max_age():
    calls = []

    def count():
        calls.append(1)
        return len(calls)

    value = metrics_server.BackgroundValue(count, max_age=3600)
    assert [value() for _ in range(100)] == [1] * 100
    assert len(calls) == 1
