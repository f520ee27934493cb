"""The bootstrap interval of a bench's median ratio (bench_pods.ratio_interval): what a row's
why line says of how far its one run can be trusted. It must bracket the ratio, follow the
direction of the comparison, widen with the pods' spread and give the same answer for the
same samples."""

from __future__ import annotations

import pytest

from bench.bench_pods import describe_interval, ratio_interval

TIGHT = [100.0 + (i % 5) * 0.2 for i in range(40)]  # 100.0-100.8 ms
SPREAD = [60.0 + (i * 37 % 41) * 2.0 for i in range(40)]  # 60-140 ms, the same median order


@pytest.mark.parametrize(
    "a, b, lo, hi",
    [
        ([3.0] * 10, [2.0] * 10, 1.5, 1.5),  # no spread: the ratio itself
        ([2.0] * 10, [3.0] * 10, 0.667, 0.667),  # control: the other direction
        ([x * 1.5 for x in TIGHT], TIGHT, 1.49, 1.51),  # tight samples, a clear difference
    ],
)
def test_the_interval_of_samples_without_much_spread_is_the_ratio(a, b, lo, hi):
    got = ratio_interval(a, b)
    assert lo <= got[0] <= got[1] <= hi


def test_a_spread_widens_the_interval_around_the_same_ratio():
    """Control: the same comparison of tight samples gives a narrow one."""
    wide, narrow = ratio_interval(SPREAD, SPREAD), ratio_interval(TIGHT, TIGHT)
    assert wide[0] < 0.9 and wide[1] > 1.1
    assert 0.99 <= narrow[0] <= 1.0 <= narrow[1] <= 1.01


def test_the_same_samples_give_the_same_interval():
    assert ratio_interval(SPREAD, TIGHT) == ratio_interval(list(SPREAD), list(TIGHT))


def test_describe_interval():
    assert describe_interval((1.027, 1.128)) == "95 % interval 1.027-1.128"
