"""The one netns entry (nri_cni/node/workers.py `enter`) refuses what is no netns, before entering
anything: a missing path, and a file that is not a network namespace (a bind mount's leftover).
Without root: it refuses before any setns that would need it."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from nri_cni.node.workers import NetnsGone, enter, socket_in


def udp() -> socket.socket:
    raise AssertionError("made outside a netns")  # never reached: the entry refuses first


@pytest.fixture
def home():
    fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def test_a_missing_netns_is_gone(tmp_path, home):
    with pytest.raises(NetnsGone) as err:
        enter(str(tmp_path / "no-such-netns"), home, udp)
    assert err.value.errno == errno.ENOENT


def test_a_file_that_is_no_netns_is_gone(tmp_path, home):
    leftover = tmp_path / "cni-1234"
    leftover.write_text("")
    with pytest.raises(NetnsGone) as err:
        enter(str(leftover), home, udp)
    assert err.value.errno == errno.EINVAL


def test_socket_in_runs_only_on_a_pool_worker(tmp_path):
    with pytest.raises(RuntimeError, match="NetnsWorkers"):
        socket_in(str(tmp_path / "no-such-netns"), udp)
