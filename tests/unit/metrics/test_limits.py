"""The metrics endpoint's limits: accept errors are logged at a bounded rate, and a value
computed in the background is computed once per max age (tests/integration/metrics/
test_metrics_connection_cap.py holds the connection cap on a running daemon)."""

from __future__ import annotations

import asyncio
import logging
import threading

from nri_cni.metrics import limits as metrics_server
from nri_cni.metrics.endpoint import Metrics
from tests.support.harness import run

ACCEPT_ERROR = {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}


async def accept_errors_while_serving(path: str, times: int) -> None:
    """`times` accept errors reported to the loop while a Metrics serves on `path`."""
    metrics = Metrics()
    await metrics.serve(path)
    try:
        loop = asyncio.get_running_loop()
        for _ in range(times):
            loop.call_exception_handler(dict(ACCEPT_ERROR))
    finally:
        await metrics.close()


def test_accept_errors_are_logged_at_a_bounded_rate_while_metrics_serve(caplog, tmp_path):
    with caplog.at_level(logging.ERROR):
        run(accept_errors_while_serving(str(tmp_path / "m.sock"), 5000))
    lines = [r for r in caplog.records if "accept" in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == "nri_cni.metrics", [r.name for r in lines]
    # control: once the server closed, the filter is gone and asyncio reports each one
    caplog.clear()

    async def after_close():
        loop = asyncio.get_running_loop()
        for _ in range(3):
            loop.call_exception_handler(dict(ACCEPT_ERROR))

    with caplog.at_level(logging.ERROR):
        run(after_close())
    assert [r.name for r in caplog.records if "accept" in r.getMessage()] == ["asyncio"] * 3


def test_other_loop_reports_pass_the_filter():
    record = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved", (), None
    )
    assert metrics_server.AcceptErrorFilter().filter(record) is True


def test_background_value_is_computed_once_per_max_age():
    calls = []
    now = [0.0]

    def count():
        calls.append(1)
        return len(calls)

    value = metrics_server.BackgroundValue(count, max_age=60, clock=lambda: now[0])
    assert [value() for _ in range(100)] == [1] * 100
    assert len(calls) == 1
    now[0] = 61.0  # past max age: outside a loop the refresh runs in place
    assert value() == 2 and value() == 2 and len(calls) == 2


def test_past_max_age_the_refresh_runs_off_the_loop_and_the_old_value_is_served_meanwhile():
    release = threading.Event()
    computed = []
    now = [0.0]

    def slow():
        if computed:
            release.wait()
        computed.append(threading.current_thread())
        return len(computed)

    async def scenario():
        value = metrics_server.BackgroundValue(slow, max_age=60, clock=lambda: now[0])
        assert value() == 1
        now[0] = 61.0
        assert value() == 1 and value() == 1  # the refresh started once, the old value served
        release.set()
        while value() != 2:
            await asyncio.sleep(0)  # its done callback runs on the loop
        assert computed[1] is not threading.main_thread() and len(computed) == 2

    run(scenario())
