"""The one way into a pod's netns (nri_cni/node/workers.py `enter`), as FINALIZE's MAC/MTU fill
uses it (nri_cni/node/netlink.py) from a thread of its own: it reads the pod's interface, never
the daemon's, and leaves the calling thread where it was."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

from nri_cni.cni.result import Interface, Result
from nri_cni.node.netlink import fill_interface_details
from nri_cni.node.workers import NetnsGone, socket_in_netns
from tests.support.janitor import Janitor

pytestmark = pytest.mark.netns


def own_netns() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


@pytest.fixture
def jan():
    if os.geteuid() != 0:
        pytest.fail("the netns entry tests need root (netns, links)")
    j = Janitor()
    yield j
    j.cleanup_or_raise()


def test_fill_reads_the_pods_interface_and_the_caller_stays_home(jan):
    ns = jan.netns()
    ns.run("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")  # both ends inside it
    ns.run("ip", "link", "set", "d0", "mtu", "1400", "address", "02:00:00:00:22:01")
    home = own_netns()
    result = Result(cni_version="1.1.0", interfaces=[Interface(name="d0", sandbox=ns.path)])
    filled = asyncio.run(fill_interface_details(ns.path, result))
    assert (filled.interfaces[0].mac, filled.interfaces[0].mtu) == ("02:00:00:00:22:01", 1400)
    assert own_netns() == home
    # what runs there is in that netns (its own inode), the caller's thread never left home
    seen = []
    sock = socket_in_netns(
        ns.path, lambda: seen.append(own_netns()) or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    )
    sock.close()
    assert seen == [os.stat(ns.path).st_ino] and seen[0] != home and own_netns() == home


def test_a_netns_that_is_gone_leaves_the_result_as_it_was(jan):
    ns = jan.netns()
    path = ns.path
    result = Result(cni_version="1.1.0", interfaces=[Interface(name="eth0", sandbox=path)])
    jan.cleanup_or_raise()  # the netns goes before the fill
    assert asyncio.run(fill_interface_details(path, result)).interfaces[0].mac == ""
    with pytest.raises(NetnsGone):
        socket_in_netns(path, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
