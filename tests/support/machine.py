"""The machine's turn: one lock file that every test run and bench on this machine shares.

Integration tests and benches change host state (netns, links, iptables, leases) and check it
before and after; they also sweep what their runtimes leave (orphan netns pins, cgroups). Two of
them at once on one machine would see, or remove, each other's doing. Each holds the lock while
it runs: a test from its setup to its teardown, a bench for the whole of one bench.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MACHINE_LOCK = Path("/run/lock/nri-cni-tests.lock")


@contextmanager
def machine_turn(who: str = "test") -> Iterator[None]:
    """Holds the machine-wide lock; says once on stderr when it has to wait for it."""
    MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)  # a fresh /run has no lock dir yet
    fd = os.open(MACHINE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"\n[{who} waiting for {MACHINE_LOCK}: another run's test or bench]", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
