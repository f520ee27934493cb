"""Hooks the CNI runtime calls around each plugin: per-plugin timings for the pod log line, and
which plugin of a chain was running when it failed (the doomed-delete record needs its position).

Nothing here can make the daemon kill itself: the crash tests inject faults from outside, the
way a node sees them (tests/plugins/block_plugin.py holds a plugin while the test kills nri-cni
by PID).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from nri_cni.cni.config import NetworkConfigList
from nri_cni.cni.result import Result
from nri_cni.cni.runtime import RuntimeConf, RuntimeHooks


class PluginHooks(RuntimeHooks):
    def __init__(self) -> None:
        # container id -> {(network, command): (plugin index, start time)} of the plugin that is
        # running now; an entry left behind names the plugin that failed.
        self._running: dict[str, dict[tuple[str, str], tuple[int, float]]] = {}
        # container id -> [{"network", "plugin", "command", "ms"}], drained by the pod plan
        self.timings: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def before_plugin(
        self, command: str, net: NetworkConfigList, index: int, rt: RuntimeConf | None
    ) -> None:
        if rt is None:
            return
        self._running.setdefault(rt.container_id, {})[(net.name, command)] = (index, time.perf_counter())

    async def after_plugin(
        self, command: str, net: NetworkConfigList, index: int, rt: RuntimeConf | None, result: Result | None
    ) -> None:
        if rt is None:
            return
        running = self._running.get(rt.container_id, {})
        started = running.pop((net.name, command), None)
        if not running:
            self._running.pop(rt.container_id, None)
        if started is not None:
            plugins = net.finalize_plugins if command == "FINALIZE" else net.plugins
            # FINALIZE indexes run on into the _finalize.d drop-ins, which the list does not hold
            name = plugins[index].type if index < len(plugins) else f"finalize-dropin#{index}"
            self.timings[rt.container_id].append(
                {
                    "network": net.name,
                    "plugin": name,
                    "command": command,
                    "ms": round((time.perf_counter() - started[1]) * 1000, 2),
                }
            )

    def failed_index(self, container_id: str, network: str, command: str) -> int | None:
        """The position of the plugin that started and never finished: the one that failed."""
        running = self._running.get(container_id, {})
        started = running.pop((network, command), None)
        if not running:
            self._running.pop(container_id, None)
        return None if started is None else started[0]

    def drain(self, container_id: str) -> list[dict[str, Any]]:
        """The timings of one pod operation; forgets whatever else is kept for the pod."""
        self._running.pop(container_id, None)
        return self.timings.pop(container_id, [])

    def __len__(self) -> int:
        """Pods something is kept for (bounded by the pods with an operation in flight)."""
        return len(set(self._running) | set(self.timings))
