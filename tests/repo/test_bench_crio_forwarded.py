"""bench_crio's same-work creation (the `crio_creation` row): a pod's RunPodSandbox less its CHECK
answered from the records, from the shim's request decoded to the answer, plus the plugins'
CHECK as nri-cni runs it."""

from __future__ import annotations

import pytest

from bench.bench_crio import forwarded_check, records_check_ms


@pytest.mark.parametrize(
    "op, ms",
    [
        ({"ms": 0.03, "marks": {"accepted": -2.9, "read": -2.6, "decoded": -2.2}}, 2.23),
        # control: the same record decoded closer to its start takes out less
        ({"ms": 0.03, "marks": {"accepted": -2.9, "read": -2.6, "decoded": -0.5}}, 0.53),
        ({"ms": 0.05, "marks": {"decoded": 0.0}}, 0.05),
    ],
)
def test_the_records_check_runs_from_decoded_to_the_answer(op, ms):
    assert records_check_ms(op) == pytest.approx(ms)


@pytest.mark.parametrize(
    "op",
    [
        {"ms": 0.03},  # no marks: not a shim request's record
        {"ms": 0.03, "marks": {"read": -2.6}},
        {"ms": 0.03, "marks": {"decoded": 1.0}},  # after its start: not the request's instant
    ],
)
def test_a_records_check_without_its_decoded_instant_is_refused(op):
    with pytest.raises(RuntimeError, match="decoded"):
        records_check_ms(op)


def test_each_pod_trades_its_records_check_for_the_plugins():
    # pod 1: 100 - 2 + 28 = 126; pod 2 ran the plugins' CHECK (no record): as measured, 90;
    # pod 3: 110 - 3 + 30 = 137
    out = forwarded_check(
        [100.0, 90.0, 110.0], [2.0, None, 3.0], [28.0, 99.0, 30.0], [100.0] * 3, [120.0] * 3
    )
    assert out["run_median"] == 126.0
    assert out["run_median_ratio"] == 1.26
    assert out["over_floor"] == 1.05  # the same work against the floor's pods
    lo, hi = out["over_floor_interval"]
    assert (lo, hi) == (0.75, 1.142)  # the pods 90-137 ms against 120: the extremes
    assert out["records_check_median_ms"] == 2.5  # of the pods answered from the records
    assert out["plugins_check_median_ms"] == 30.0


def test_every_pod_needs_its_record_slot_and_its_check_time():
    with pytest.raises(RuntimeError, match="3 pods, 2 CHECK records"):
        forwarded_check([1.0, 2.0, 3.0], [None, None], [1.0, 2.0, 3.0], [1.0], [1.0])


def test_the_floor_is_compared_pod_by_pod_like_crio_s_own():
    """Control of the line above: the same pods against a slower floor give a lower ratio, and
    the two comparisons use their own side's pods."""
    runs, records, checks = [100.0, 90.0, 110.0], [2.0, None, 3.0], [28.0, 99.0, 30.0]
    out = forwarded_check(runs, records, checks, [100.0] * 3, [140.0] * 3)
    assert (out["run_median_ratio"], out["over_floor"]) == (1.26, 0.9)
