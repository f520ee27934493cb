"""The one way into a pod's netns (nri_cni/node/workers.py `enter`), as the answer's MAC/MTU fill
uses it (nri_cni/node/netlink.py) through the pods' own pool: it reads the pod's interface, never
the daemon's, and the worker (and the caller) are back home after."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

from nri_cni.cni.result import Interface, Result
from nri_cni.node import NodeInspector
from nri_cni.node.netlink import fill_interface_details
from nri_cni.node.workers import NetnsGone, socket_in
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


@pytest.fixture
def inspector():
    ins = NodeInspector.with_workers(1)  # one worker: each job below runs on the one that filled
    yield ins
    ins.close()


def in_pool(ins: NodeInspector, fn, *args):
    return ins._pool.submit(fn, *args).result()


def test_fill_reads_the_pods_interface_and_the_caller_stays_home(jan, inspector):
    ns = jan.netns()
    ns.run("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")  # both ends inside it
    ns.run("ip", "link", "set", "d0", "mtu", "1400", "address", "02:00:00:00:22:01")
    home = own_netns()
    result = Result(cni_version="1.1.0", interfaces=[Interface(name="d0", sandbox=ns.path)])
    filled = asyncio.run(fill_interface_details(inspector.interface_details, ns.path, result))
    assert (filled.interfaces[0].mac, filled.interfaces[0].mtu) == ("02:00:00:00:22:01", 1400)
    assert own_netns() == home and in_pool(inspector, own_netns) == home  # the worker is back too
    # what runs there is in that netns (its own inode), the caller's thread never left home
    seen = []
    sock = in_pool(
        inspector,
        socket_in,
        ns.path,
        lambda: seen.append(own_netns()) or socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
    )
    sock.close()
    assert seen == [os.stat(ns.path).st_ino] and seen[0] != home and own_netns() == home
    assert in_pool(inspector, own_netns) == home


def test_a_netns_that_is_gone_leaves_the_result_as_it_was(jan, inspector):
    ns = jan.netns()
    path = ns.path
    result = Result(cni_version="1.1.0", interfaces=[Interface(name="eth0", sandbox=path)])
    jan.cleanup_or_raise()  # the netns goes before the fill
    assert (
        asyncio.run(fill_interface_details(inspector.interface_details, path, result)).interfaces[0].mac == ""
    )
    with pytest.raises(NetnsGone):
        in_pool(inspector, socket_in, path, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
