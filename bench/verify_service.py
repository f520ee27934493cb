"""bench_verify's "service" method: the same pods verified the way the daemon does it, through
PodService.verify (issue 17): every listed pod's cache entries read, its expectations built, one
netlink round, the verdicts written to the health book.

Each bench pod gets a cache entry as the bridge plugin would have left it (eth0 in the pod with
its address and MAC, the host veth), and the runtime's pod list names it with its IP. The
network's CHECK is off (`disableCheck`: the bench pods are no plugin's) and `repair` is
verify-only, so a round only reads; a flushed pod must come out broken "repair-off".
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.model import PodInfo
from nri_cni.pod.plan import PodPlan
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import PodState
from nri_cni.service.service import PodService

NETWORK = "benchnet"


class BenchPod(Protocol):
    netns: str
    host_veth: str
    mac: str

    @property
    def path(self) -> str: ...

    @property
    def address(self) -> Any: ...


def pod_id(pod: BenchPod) -> str:
    return pod.netns.encode().hex().ljust(64, "0")[:64]


def build(pods: Sequence[BenchPod], tmp: Path) -> PodService:
    doc = {
        "mode": "shim",
        "state_dir": str(tmp / "state"),
        "daemon": {"socket": str(tmp / "daemon.sock")},
        "cni": {"bin_dirs": [str(tmp / "bin")], "cache_dir": str(tmp / "cache")},
        "files": {"trust": "warn"},
        "repair": "verify-only",
        "networks": [
            {
                "name": NETWORK,
                "default": True,
                "conflist": {
                    "cniVersion": "1.1.0",
                    "name": NETWORK,
                    "disableCheck": True,
                    "plugins": [{"type": "bridge", "bridge": "nctbench0"}],
                },
            }
        ],
    }
    (tmp / "bin").mkdir(exist_ok=True)
    cfg = parse_config(doc, str(tmp / "config.yaml"))
    config = cfg.networks[0].conflist.bytes
    cache = ResultCache(cfg.cni.cache_dir)
    listed = []
    for pod in pods:
        result = {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": pod.host_veth}, {"name": "eth0", "mac": pod.mac, "sandbox": pod.path}],
            "ips": [{"address": str(pod.address), "interface": 1}],
        }
        pid = pod_id(pod)
        cache.write(CacheEntry(pid, "eth0", NETWORK, config, pod.path, result=result), durable=False)
        listed.append(
            PodInfo(pid, name=pod.netns, namespace="bench", netns=pod.path, ips=(str(pod.address.ip),))
        )
    cni = CNIRuntime(list(cfg.cni.bin_dirs), cfg.cni.cache_dir, trust_files=False)
    svc = PodService(cfg, plan=PodPlan(cfg, cni), mode=mode_for(cfg))
    svc.ledger.synchronized(listed)
    return svc


def measure(pods: Sequence[BenchPod], rounds: int) -> dict[str, Any]:
    """Median seconds of a full PodService.verify round over `pods` (after one warm-up round)."""
    with tempfile.TemporaryDirectory(prefix="nct-verify-") as tmp:
        svc = build(pods, Path(tmp))

        async def run() -> tuple[list[float], int]:
            times, not_ok = [], 0
            try:
                for r in range(rounds + 1):
                    t0 = time.perf_counter()
                    verdicts = await svc.verify()
                    if r:
                        times.append(time.perf_counter() - t0)
                    not_ok = max(not_ok, sum(h.state is not PodState.OK for h in verdicts))
                    if len(verdicts) != len(pods):
                        raise RuntimeError(f"a round gave {len(verdicts)} verdicts for {len(pods)} pods")
            finally:
                await svc.close()
            return times, not_ok

        times, not_ok = asyncio.run(run())
    med = statistics.median(times)
    return {
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "per_pod_us": med / len(pods) * 1e6,
        "not_ok": not_ok,
    }


def broken_after_damage(pods: Sequence[BenchPod]) -> set[str]:
    """One round after the damage check flushed some pods: the netns names it reports broken."""
    with tempfile.TemporaryDirectory(prefix="nct-verify-") as tmp:
        svc = build(pods, Path(tmp))

        async def run() -> set[str]:
            try:
                return {h.pod_id for h in await svc.verify() if h.state is PodState.BROKEN}
            finally:
                await svc.close()

        broken = asyncio.run(run())
    return {p.netns for p in pods if pod_id(p) in broken}
