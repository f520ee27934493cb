"""The one netns entry (nri_cni/node/workers.py) refuses what is no netns, before entering
anything: a missing path, and a file that is not a network namespace (a bind mount's leftover)."""

from __future__ import annotations

import errno
import socket

import pytest

from nri_cni.node.workers import NetnsGone, NetnsWorkers, socket_in


def udp() -> socket.socket:
    raise AssertionError("made outside a netns")  # never reached: the entry refuses first


@pytest.fixture
def pool():
    p = NetnsWorkers(1)
    yield p
    p.close()


def test_a_missing_netns_is_gone(tmp_path, pool):
    with pytest.raises(NetnsGone) as err:
        pool.submit(socket_in, str(tmp_path / "no-such-netns"), udp).result()
    assert err.value.errno == errno.ENOENT


def test_a_file_that_is_no_netns_is_gone(tmp_path, pool):
    leftover = tmp_path / "cni-1234"
    leftover.write_text("")
    with pytest.raises(NetnsGone) as err:
        pool.submit(socket_in, str(leftover), udp).result()
    assert err.value.errno == errno.EINVAL


def test_socket_in_runs_only_on_a_pool_worker(tmp_path):
    with pytest.raises(RuntimeError, match="NetnsWorkers"):
        socket_in(str(tmp_path / "no-such-netns"), udp)
