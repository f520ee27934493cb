"""Hooks the CNI runtime calls around each plugin: per-plugin timings for the pod log line, and
crash points for the recovery tests.

NRI_CNI_CRASH_AT (a debugging facility, documented in README "Troubleshooting"): when set to
`<COMMAND>:<network>:<plugin index>:<before|after>` or `cache:<network>`, the daemon kills itself
with SIGKILL at that point, exactly as an OOM kill or a node crash would. It is how the tests
prove that an ADD interrupted anywhere leaves nothing that the next start does not clean.
"""
from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

CRASH_ENV = "NRI_CNI_CRASH_AT"


class PluginHooks:
    def __init__(self) -> None:
        self._started: dict[tuple, float] = {}
        # container id -> [{"network", "plugin", "command", "ms"}], drained by the pod plan
        self.timings: dict[str, list[dict]] = defaultdict(list)
        self.crash_at = os.environ.get(CRASH_ENV, "")

    def _maybe_crash(self, point: str) -> None:
        if self.crash_at and self.crash_at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    async def before_plugin(self, command, net, index, rt) -> None:
        self._maybe_crash(f"{command}:{net.name}:{index}:before")
        self._started[(rt.container_id, net.name, index, command)] = time.perf_counter()

    async def after_plugin(self, command, net, index, rt, result) -> None:
        t0 = self._started.pop((rt.container_id, net.name, index, command), None)
        if t0 is not None:
            plugins = net.finalize_plugins if command == "FINALIZE" else net.plugins
            # FINALIZE indexes run on into the _finalize.d drop-ins, which the list does not hold
            name = plugins[index].type if index < len(plugins) else f"finalize-dropin#{index}"
            self.timings[rt.container_id].append({
                "network": net.name, "plugin": name, "command": command,
                "ms": round((time.perf_counter() - t0) * 1000, 2)})
        self._maybe_crash(f"{command}:{net.name}:{index}:after")

    async def before_cache_write(self, net, rt, result) -> None:
        self._maybe_crash(f"cache:{net.name}")

    def drain(self, container_id: str) -> list[dict]:
        return self.timings.pop(container_id, [])
