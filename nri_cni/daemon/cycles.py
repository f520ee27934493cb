"""Collecting the reference cycles the local socket's connections leave.

asyncio's socket transport keeps a bound method of itself (its read callback): a closed
connection is a reference cycle, a few KiB that only the cycle collector frees. The daemon's
collector runs rarely (nri_cni/cli/gctune.py: its first threshold counts objects still alive,
and a pod operation leaves few), so these piled up with every shim call (the soak's 500 pods:
~2,000 connections, ~7 KiB a pod of resident memory). A full collection after every
COLLECT_EVERY connections bounds them; it walks only what was made since start-up (the start-up
heap is frozen), about a millisecond.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

COLLECT_EVERY = 64  # connections closed between two collections


def due(closed: int, every: int = COLLECT_EVERY) -> bool:
    """A collection is due once `closed` connections closed since the last one."""
    return closed >= every


class CycleCollector:
    def __init__(self, collect: Callable[[], object] = gc.collect, every: int = COLLECT_EVERY) -> None:
        self.collect = collect
        self.every = every
        self.closed = 0  # connections closed since the last collection

    def connection_closed(self) -> None:
        self.closed += 1
        if due(self.closed, self.every):
            self.closed = 0
            self.collect()
