"""The daemon's thread switch interval.

The event loop hands work that would block it to threads: GC's reading of every cache entry,
the netns workers' netlink reads, fsyncs, the netlink fill. A thread that computes (parses JSON,
decodes netlink) holds the GIL until CPython asks it to let go, after `sys.getswitchinterval()`
(5 ms by default); meanwhile the loop, woken by a pod's request, cannot run. Measured with
bench_gc (40 stale pods, an NRI RunPodSandbox sent as GC begins, the cache read in a thread):
the ADD began 9, 6, 1 / 1, 1, 1 / 1, 3, 1 ms after it was sent at 5 ms, 1-2 ms in every round at
0.5 ms; GC's own speed the same (2.70-3.12x libcni). Two threads that compute at once switch
more often: a few microseconds per switch.
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL = 0.0005  # seconds


def tune_threads() -> None:
    """Call once, before the event loop starts."""
    sys.setswitchinterval(SWITCH_INTERVAL)
