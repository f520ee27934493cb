"""A node for the daemon benches: `nri-cni run` as a real process (mode native) against the
runtime-side NRI double of the tests, driven through its public ways in only: NRI
(RunPodSandbox, StopPodSandbox, RemovePodSandbox, Synchronize at each (re)start) and the local
socket (`status`, `pods`). Nothing of nri_cni's inside is called, so the benches measure
whatever the daemon does, however it is organized.

Everything made is removed by `await drain()` (pods still attached: NRI stop + remove while
the daemon runs; the daemon; the double) and then `cleanup()` outside the event loop (temp dirs,
the shared iptables chains portmap leaves behind; netns and bridges are the Janitor's).
pyroute2's synchronous calls cannot run inside a running event loop: netns, subnets and
bridge names are made before it starts (`bridge_list`, `Janitor.netns`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from nri_cni.api import nri_pb2
from tests.support.conflists import bridge_conflist, host_local, network, portmap
from tests.support.daemon_config import daemon_config
from tests.support.firewall import iptables_lines, remove_cni_scaffolding
from tests.support.janitor import Janitor
from tests.support.names import free_subnet, unique_name
from tests.support.nri_runtime import NriRuntime
from tests.support.nricni import NriCni


def free_subnet6() -> ipaddress.IPv6Network:
    """A random unique-local /64 (fd00::/8, 56 random bits) that no host route overlaps."""
    used = subprocess.run(
        ["ip", "-6", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    while True:
        net = ipaddress.IPv6Network(((0xFD << 120) | (random.getrandbits(56) << 64), 64))
        if str(net).split("::")[0] not in used:
            return net


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pod_message(pod_id: str, netns: str) -> nri_pb2.PodSandbox:
    pod = nri_pb2.PodSandbox(
        id=pod_id, name=f"bench-{pod_id[:8]}", namespace="nct-bench", uid=str(uuid.uuid4())
    )
    pod.linux.namespaces.add(type="network", path=netns)
    return pod


def new_pod_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


class NativeNode:
    def __init__(self, jan: Janitor, bin_dirs: list[str], **cfg_extra) -> None:
        self.jan = jan
        self.tmp = Path(tempfile.mkdtemp(prefix="nct-bench-node-"))
        self.sock_dir = Path(tempfile.mkdtemp(prefix="nct-"))  # unix socket paths are short
        self.bin_dirs = bin_dirs
        self.cfg_extra = cfg_extra
        self.ipt_baseline = set(iptables_lines())
        self.runtime: NriRuntime | None = None
        self.daemon: NriCni | None = None
        self.pods: dict[str, nri_pb2.PodSandbox] = {}  # attached through NRI, not yet removed
        self._starts = 0
        (self.tmp / "_finalize.d").mkdir()

    # -- networks ------------------------------------------------------------------------------

    def bridge_list(self, name: str, *, dual_stack: bool = False) -> dict:
        """bridge + host-local + portmap on a bridge and subnet of its own (no masquerade, no
        gateway: nothing leaves the node); `dual_stack`: an IPv6 range (a random unique-local
        /64) beside the IPv4 one, every pod gets an address of each."""
        bridge = unique_name("bg")
        self.jan.track_link(bridge)
        subnets = [str(free_subnet(prefixlen=22))]
        if dual_stack:
            subnets.append(str(free_subnet6()))
        ipam = host_local(self.tmp / f"ipam-{name}", *subnets)
        return bridge_conflist(name, bridge, ipam, gateway=False, then=[portmap(snat=False)])

    # -- the daemon ----------------------------------------------------------------------------

    def config(self, conflist: dict) -> dict:
        # no timer GC in the middle of a measurement; the node's own settings last
        extra = {"log": {"level": "info"}, "gc": {"interval": 0}, "status": {"interval": 0}, **self.cfg_extra}
        return daemon_config(
            extra.pop("mode", "native"),
            [network(conflist)],
            nri_socket=self.sock_dir / "nri.sock",
            daemon_socket=self.sock_dir / "d.sock",
            state_dir=self.tmp / "state",
            bin_dirs=self.bin_dirs,
            cache_dir=self.tmp / "cache",
            finalize_dir=self.tmp / "_finalize.d",
            plugin_timeout="60s",
            **extra,
        )

    async def start(self, conflist: dict, pods: list[nri_pb2.PodSandbox] = ()) -> float:
        """Starts the daemon (the double lists `pods` in its Synchronize); returns the seconds
        from the process's start until the daemon reports itself synchronized (ready)."""
        if self.runtime is None:
            self.runtime = NriRuntime(str(self.sock_dir / "nri.sock"), request_timeout_ms=120000)
            await self.runtime.start()
        self.runtime.pods = list(pods)
        if self.daemon is None:
            self.daemon = NriCni(self.tmp, self.config(conflist))
        self._starts += 1
        t0 = time.perf_counter()
        await asyncio.to_thread(self.daemon.start)
        ready = time.perf_counter() - t0
        await self.runtime.wait_plugin(self._starts, timeout=60)
        return ready

    async def stop(self) -> None:
        if self.daemon is not None:
            await asyncio.to_thread(self.daemon.stop)

    def log_size(self) -> int:
        return self.daemon.log_path.stat().st_size if self.daemon else 0

    async def wait_log(self, text: str, since: int, timeout: float = 600, poll: float = 0.005) -> float:
        """Until `text` appears in the daemon's log after offset `since`; perf_counter then."""
        deadline = time.monotonic() + timeout
        fd = os.open(self.daemon.log_path, os.O_RDONLY)  # a local file: reads do not block
        try:
            seen, needle = b"", text.encode()
            while True:
                chunk = os.pread(fd, 1 << 20, since + len(seen))
                seen += chunk
                if needle in seen:
                    return time.perf_counter()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no {text!r} in the daemon's log:\n{self.daemon.log_tail()}")
                if not chunk:
                    await asyncio.sleep(poll)
        finally:
            os.close(fd)

    # -- pods ----------------------------------------------------------------------------------

    async def run_pod(self, netns: str) -> tuple[nri_pb2.PodSandbox, float]:
        """NRI RunPodSandbox of a new pod; (pod, ms). The pod must come back with an IP."""
        pod = pod_message(new_pod_id(), netns)
        self.pods[pod.id] = pod  # before the call: a failed ADD is still owed a removal
        t0 = time.perf_counter()
        resp = await self.runtime.run_pod_sandbox(pod)
        ms = (time.perf_counter() - t0) * 1000
        if not resp.adjust.network.ips:
            raise RuntimeError(f"pod {pod.id[:12]}: RunPodSandbox answered no IP")
        pod.ips.extend(resp.adjust.network.ips)  # a PR #295 runtime keeps them: its pod list shows them
        return pod, ms

    async def remove_pod(self, pod: nri_pb2.PodSandbox) -> float:
        t0 = time.perf_counter()
        await self.runtime.stop_pod_sandbox(pod)
        await self.runtime.remove_pod_sandbox(pod)
        self.pods.pop(pod.id, None)
        return (time.perf_counter() - t0) * 1000

    def forget_pods(self) -> list[nri_pb2.PodSandbox]:
        """The runtime "loses" its pods (removed while nri-cni was down): they become stale."""
        gone, self.pods = list(self.pods.values()), {}
        return gone

    def attached(self) -> list[dict]:
        return self.daemon.pods()

    # -- cleanup -------------------------------------------------------------------------------

    async def drain(self) -> list[str]:
        problems: list[str] = []
        if self.daemon is not None and self.daemon.proc and self.daemon.proc.poll() is None:
            for pod in list(self.pods.values()):
                try:
                    await self.remove_pod(pod)
                except Exception as exc:
                    problems.append(f"remove pod {pod.id[:12]}: {exc}")
            try:
                left = self.attached()
                if left:
                    # stale ones (a bench stopped midway): an explicit GC with the runtime's list
                    await asyncio.to_thread(self.daemon.ask, "gc")
            except Exception as exc:
                problems.append(f"final gc: {exc}")
        await self.stop()
        if self.runtime is not None:
            await self.runtime.stop()
        return problems

    def cleanup(self) -> None:
        remove_cni_scaffolding(self.ipt_baseline)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
