"""The daemon's thread switch interval (nri_cni/cli/threadtune.py): shorter than CPython's
default, so the event loop waits less for a thread that computes."""

from __future__ import annotations

import sys

import pytest

from nri_cni.cli import threadtune


@pytest.fixture
def restored():
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_tune_threads_sets_the_daemons_switch_interval(restored):
    sys.setswitchinterval(0.005)  # CPython's default (control: what it replaces)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    threadtune.tune_threads()
    assert sys.getswitchinterval() == pytest.approx(threadtune.SWITCH_INTERVAL)
    assert threadtune.SWITCH_INTERVAL <= 0.001
