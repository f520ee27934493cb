"""Acceptance 6, the soak: 500 pods created and removed through containerd 2.1.9 and the shim, 8 at
a time (every 10th with a host port: portmap's per-pod iptables chains). The daemon's resident
memory, idle, after the first 50 and then every 90 pods, grows by at most MAX_SLOPE KiB a pod
(the samples' least-squares slope) and by at most 10% at the end; and nothing leaks: host-local reservations, cache files, intent records, bridge ports, host veths,
iptables/nft rules, the daemon's file descriptors and child processes, and what it keeps per
pod in memory (`nri-cni status`: tracked). The figures are printed (pytest -s shows them).

One network (bridge, host-local, portmap) keeps the 2-CPU run near a minute and a half: what a
pod costs is containerd's and runc's work and the kernel's (netns, veth), not nri-cni's.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from nri_cni.local import proto as localproto
from nri_cni.local.codec import RESPONSE_HEAD, decode_response_head, encode_request
from tests.support.recovery_node import rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

PODS = 500
FIRST = 50
PARALLEL = 8
SAMPLES = 5  # idle RSS samples after the first pods, one every (PODS - FIRST) / SAMPLES pods
MAX_SLOPE = 1.0  # KiB a pod (the samples vary by ~0.2 MiB; the cycles of shim connections were ~7)


def _proc(pid: int) -> dict:
    """VmRSS (KiB), open fds and live children of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    children = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children += 1
            except (OSError, ValueError, IndexError):
                pass
    return {"rss": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "children": children}


def _status(daemon) -> dict:
    """The daemon's status, returned once the daemon has closed the connection (its EOF): the
    answer comes before the daemon's close, and the connection's descriptor must not be
    counted with the daemon's own (a busy machine lost that race: 13 fds, then 12)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)  # only fails a hang
        sock.connect(daemon.socket)
        sock.sendall(encode_request([(localproto.OP_KEY, "status")]))
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    status, length = decode_response_head(data[:RESPONSE_HEAD])
    assert status == 0 and len(data) == RESPONSE_HEAD + length, data[:200]
    return json.loads(data[RESPONSE_HEAD:])


def _idle(daemon) -> dict:
    """Waits until nothing is in flight and no plugin process is left, then measures (the
    deadline only fails a hang)."""
    deadline = time.monotonic() + 60
    while True:
        tracked = _status(daemon)["tracked"]
        measured = _proc(daemon.proc.pid)
        if tracked["operations"] == 0 and tracked["background"] == 0 and measured["children"] == 0:
            return measured
        assert time.monotonic() < deadline, (tracked, measured)
        time.sleep(0.05)


def slope(points: list[tuple[int, int]]) -> float:
    """The least-squares slope of (pods, RSS KiB) points: KiB a pod."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def test_slope_is_the_growth_per_pod():
    assert slope([(0, 100), (10, 120), (20, 140)]) == 2.0
    assert slope([(0, 100), (10, 80), (20, 100)]) == 0.0  # control: a dip is no growth


def test_soak_500_pods_8_at_a_time(rnode):
    ctd = rnode.start_containerd()
    daemon = rnode.start_daemon(rnode.daemon_config([rnode.podnet(finalize=False)]))
    checker = rnode.leak_checker().start()
    started = _proc(daemon.proc.pid)

    def cycle(i: int) -> None:
        pod = rnode.run_pod(f"soak-{i}-{uuid.uuid4().hex[:6]}", ports=i % 10 == 0)
        checker.add_markers(pod)
        rnode.remove_pod(pod)

    t0 = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(cycle, range(FIRST)))
    after_first = _idle(daemon)
    t1 = time.monotonic()
    samples = [(FIRST, after_first["rss"])]
    step = (PODS - FIRST) // SAMPLES
    for start in range(FIRST, PODS, step):
        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(cycle, range(start, start + step)))
        at_end = _idle(daemon)
        samples.append((start + step, at_end["rss"]))
    t2 = time.monotonic()

    growth = (at_end["rss"] - after_first["rss"]) / after_first["rss"]
    per_pod = slope(samples)
    print(
        f"\nsoak: nri-cni RSS at start {started['rss']} KiB, after {FIRST} pods "
        f"{after_first['rss']} KiB, after {PODS} pods {at_end['rss']} KiB "
        f"({growth:+.1%}); samples {[rss for _, rss in samples]} KiB: {per_pod:+.2f} KiB a pod; "
        f"fds {after_first['fds']} -> {at_end['fds']}; "
        f"{FIRST} pods in {t1 - t0:.1f}s, {PODS - FIRST} in {t2 - t1:.1f}s"
    )
    assert per_pod <= MAX_SLOPE
    assert at_end["rss"] <= after_first["rss"] * 1.10
    assert at_end["fds"] == after_first["fds"]
    assert at_end["children"] == 0

    adds = [op for op in daemon.op_lines() if op["op"] == "add"]
    assert len(adds) == PODS and all(op["result"] == "ok" for op in adds)
    assert ctd.cri.list_pods() == []
    st = daemon.status()
    assert st["attachments"] == 0 and st["pendingRollback"] == []
    assert set(st["tracked"].values()) == {0}, st["tracked"]
    assert daemon.ask("gc") == {"deleted": [], "rolledBack": [], "errors": []}
    assert rnode.reservations() == []
    assert rnode.cache_files() == []
    assert rnode.intents() == []
    assert rnode.bridge_ports() == []
    assert checker.leaks() == []
