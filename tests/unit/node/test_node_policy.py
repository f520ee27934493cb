"""The CHECK cadence: pure, no clock."""

from __future__ import annotations

import pytest

from nri_cni.node.policy import VerifyPolicy


def test_defaults():
    p = VerifyPolicy()
    assert p.interval == 30.0 and p.check_period == 300.0


def test_each_key_checked_once_every_n_rounds():
    p = VerifyPolicy(interval=30, check_every=5)
    keys = [f"pod{n}/podnet/eth0" for n in range(200)]
    for key in keys:
        due = [r for r in range(20) if p.needs_check(key, r, differs=False)]
        assert len(due) == 4 and all(b - a == 5 for a, b in zip(due, due[1:]))


def test_checks_are_spread_over_the_rounds():
    p = VerifyPolicy(check_every=10)
    per_round = [sum(p.check_due(f"pod{n}", r) for n in range(1000)) for r in range(10)]
    assert sum(per_round) == 1000 and max(per_round) < 200  # not all in one round


def test_a_difference_or_a_request_checks_at_once():
    p = VerifyPolicy(check_every=10)
    key = "pod/net/eth0"
    off = (p.slot(key) + 1) % 10
    assert not p.needs_check(key, off, differs=False)
    assert p.needs_check(key, off, differs=True)
    assert p.needs_check(key, off, differs=False, forced=True)


def test_slot_is_stable_across_processes():
    assert (
        VerifyPolicy(check_every=7).slot("abc") == VerifyPolicy(check_every=7).slot("abc") == 5
    )  # crc32("abc") % 7


@pytest.mark.parametrize("kw", [{"interval": 0}, {"interval": -1}, {"check_every": 0}])
def test_bad_values_refused(kw):
    with pytest.raises(ValueError):
        VerifyPolicy(**kw)
