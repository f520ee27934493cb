"""The one netns entry (nri_cni/node/workers.py) refuses what is no netns, before entering
anything: a missing path, and a file that is not a network namespace (a bind mount's leftover)."""

from __future__ import annotations

import errno
import socket

import pytest

from nri_cni.node.workers import NetnsGone, socket_in_netns


def udp() -> socket.socket:
    raise AssertionError("made outside a netns")  # never reached: the entry refuses first


def test_a_missing_netns_is_gone(tmp_path):
    with pytest.raises(NetnsGone) as err:
        socket_in_netns(str(tmp_path / "no-such-netns"), udp)
    assert err.value.errno == errno.ENOENT


def test_a_file_that_is_no_netns_is_gone(tmp_path):
    leftover = tmp_path / "cni-1234"
    leftover.write_text("")
    with pytest.raises(NetnsGone) as err:
        socket_in_netns(str(leftover), udp)
    assert err.value.errno == errno.EINVAL
