"""The bound a 3-network ADD at once is judged against (bench/bench_attach.py): the larger of
its slowest chain alone and the plugins' CPU time over the CPUs."""

from __future__ import annotations

import pytest

from bench.bench_attach import at_once_bound


@pytest.mark.parametrize(
    "slowest, cpu, cpus, bound",
    [
        (40.0, 60.0, 2, 40.0),  # the slowest chain rules: 60 ms of CPU fit in 30 ms on 2 CPUs
        (40.0, 100.0, 2, 50.0),  # control, the CPU time alone changed: the CPUs rule
        (40.0, 100.0, 4, 40.0),  # control, the CPUs alone changed: the slowest chain again
        (40.0, 80.0, 2, 40.0),  # equal: either
    ],
)
def test_the_larger_bound_rules(slowest, cpu, cpus, bound):
    assert at_once_bound(slowest, cpu, cpus) == bound
