"""The daemon's start/stop stack: a part that fails to start stops the ones started before it,
in reverse order, and the daemon never registers with NRI."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.daemon.app import build_daemon
from tests.support.configdocs import mode_config


class _Part:
    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    async def start(self, *args) -> None:
        self.log.append(f"start {self.name}")
        if self.fail:
            raise OSError(f"{self.name} cannot start")

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_a_part_that_fails_to_start_stops_the_ones_before_it_in_reverse(tmp_path):
    daemon = build_daemon(mode_config(tmp_path, "native"))
    log: list[str] = []
    daemon.lifecycle = _Part("lifecycle", log)  # type: ignore[assignment]
    daemon.reloader = _Part("reloader", log)  # type: ignore[assignment]
    daemon.local = _Part("local", log, fail=True)  # type: ignore[assignment]

    async def flushed() -> None:
        with pytest.raises(OSError, match="local cannot start"):
            await daemon.run(handle_signals=False)

    asyncio.run(flushed())
    assert log == ["start lifecycle", "start reloader", "start local", "close reloader", "close lifecycle"]
    assert not daemon.stub.registered.is_set()  # never connected
