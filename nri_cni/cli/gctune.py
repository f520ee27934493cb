"""The daemon's garbage-collector settings.

A pod operation allocates a few thousand short-lived objects (parsed results, dicts, futures)
and almost no reference cycles, while the start-up heap (modules, config, protobuf classes)
is large and lives forever. With CPython's defaults a young-generation collection
runs every 700 allocations and every tenth one also walks the middle generation: measured here
at 0.1 ms and 1-2 ms, landing inside plugin chains. Freezing the start-up heap keeps the full
collections from walking it; a higher first threshold makes collections rarer. Cycles are
still collected, only later: the threshold counts objects still alive, which a pod operation
leaves few of, so the cycles every shim connection leaves are collected apart
(nri_cni/daemon/cycles.py).
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Call once start-up is done (config loaded, modules imported)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
