"""bench_verify's "service" method: the same pods verified the way the daemon does it, through
ServiceTimers.verify: every listed pod's cache entries read, its expectations built, one
netlink round, the verdicts written to the health book.

Each bench pod gets a cache entry as the bridge plugin would have left it (eth0 in the pod with
its address and MAC, the host veth), and the runtime's pod list names it with its IP. The
network's CHECK is off (`disableCheck`: the bench pods are no plugin's) and `repair` is
verify-only, so a round only reads; a flushed pod must come out broken "repair-off".

The pods are dual-stack (an IPv4 and an IPv6 address each: the result lists both). With
`host_side` each pod's result also lists a route of each family (in its netns), its chain has
host-local (a lease file per address, in a temp dataDir) and portmap with one hostPort per pod:
portmap's rules are made as its iptables backend makes them for a dual-stack pod, in the nat
table of iptables and of ip6tables, a CNI-DN-style chain per pod and family (named nct...,
matching only 127.0.0.254 and, for IPv6, an address of a routed /64 of the bench that nothing
uses) reached from CNI-HOSTPORT-DNAT, and removed again, exactly those, afterwards.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import PodState
from nri_cni.service.service import PodService
from tests.support.pods import pod_plan, pod_service

NETWORK = "benchnet"


class BenchPod(Protocol):
    netns: str
    host_veth: str
    mac: str

    @property
    def path(self) -> str: ...

    @property
    def address(self) -> Any: ...

    @property
    def addresses(self) -> tuple[Any, ...]: ...

    route: str
    route6: str


def pod_id(pod: BenchPod) -> str:
    return pod.netns.encode().hex().ljust(64, "0")[:64]


FIRST_PORT = 64000  # hostPorts of the bench's DNAT rules: outside the tests' 20000-40000


class DnatRules:
    """portmap's iptables rules for the bench pods, made and removed with iptables-restore
    --noflush: only the bench's own chains are declared (declaring CNI-HOSTPORT-DNAT would
    flush the rules of everyone else's pods); its jumps go in with -A and out with -D."""

    def __init__(self, pods: Sequence[BenchPod], family: int = 4) -> None:
        tag = "".join(random.choice("0123456789abcdef") for _ in range(5))
        self.family = family
        self.tool = "iptables" if family == 4 else "ip6tables"
        self.chains = [f"NCTDN{tag}{i:05d}" for i in range(len(pods))]
        self.jumps = []
        self.rules = []
        for i, (pod, chain) in enumerate(zip(pods, self.chains, strict=True)):
            port = FIRST_PORT + i
            comment = f'"dnat name: \\"{NETWORK}\\" id: \\"{pod_id(pod)}\\""'
            if family == 4:
                dst, to = "127.0.0.254/32", f"{pod.address.ip}:80"
            else:  # an address of the bench's own routed /64, which nothing sends to
                dst, to = f"{ipaddress.ip_network(pod.route6)[254]}/128", f"[{pod.addresses[1].ip}]:80"
            self.jumps.append(
                f"CNI-HOSTPORT-DNAT -d {dst} -p tcp -m comment --comment {comment} "
                f"-m multiport --dports {port} -j {chain}"
            )
            self.rules.append(f"{chain} -d {dst} -p tcp -m tcp --dport {port} -j DNAT --to-destination {to}")
        self.made_top = False

    def port(self, i: int) -> int:
        return FIRST_PORT + i

    def make(self) -> None:
        top = subprocess.run([self.tool, "-t", "nat", "-S", "CNI-HOSTPORT-DNAT"], capture_output=True)
        if top.returncode != 0:
            subprocess.run([self.tool, "-t", "nat", "-N", "CNI-HOSTPORT-DNAT"], check=True)
            self.made_top = True
        lines = [f":{c} - [0:0]" for c in self.chains]
        lines += [f"-A {r}" for r in self.rules] + [f"-A {j}" for j in self.jumps]
        self._restore(lines)

    def remove(self) -> None:
        self._restore([f"-D {j}" for j in self.jumps], check=False)
        self._restore([f":{c} - [0:0]" for c in self.chains] + [f"-X {c}" for c in self.chains], check=False)
        if self.made_top:
            subprocess.run([self.tool, "-t", "nat", "-X", "CNI-HOSTPORT-DNAT"], capture_output=True)

    def _restore(self, lines: list[str], check: bool = True) -> None:
        text = "*nat\n" + "\n".join(lines) + "\nCOMMIT\n"
        argv = [f"{self.tool}-restore", "--noflush"]
        p = subprocess.run(argv, input=text, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"iptables-restore: {p.stderr.strip()[:500]}")


def build(pods: Sequence[BenchPod], tmp: Path, *, host_side: bool = False) -> PodService:
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
                    "plugins": _plugins(tmp, host_side),
                },
            }
        ],
    }
    (tmp / "bin").mkdir(exist_ok=True)
    cfg = parse_config(doc, str(tmp / "config.yaml"))
    config = cfg.networks[0].conflist.bytes
    cache = ResultCache(cfg.cni.cache_dir)
    listed = []
    leases = tmp / "ipam" / NETWORK
    leases.mkdir(parents=True, exist_ok=True)
    for i, pod in enumerate(pods):
        result: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": pod.host_veth}, {"name": "eth0", "mac": pod.mac, "sandbox": pod.path}],
            "ips": [{"address": str(a), "interface": 1} for a in pod.addresses],
        }
        pid = pod_id(pod)
        caps: dict[str, Any] = {}
        if host_side:
            result["routes"] = [{"dst": pod.route}] + ([{"dst": pod.route6}] if pod.route6 else [])
            caps = {"portMappings": [{"hostPort": FIRST_PORT + i, "containerPort": 80, "protocol": "tcp"}]}
            for a in pod.addresses:
                (leases / str(a.ip)).write_text(f"{pid}\r\neth0")
        entry = CacheEntry(pid, "eth0", NETWORK, config, pod.path, capability_args=caps, result=result)
        cache.write(entry, durable=False)
        listed.append(
            PodInfo(
                pid,
                name=pod.netns,
                namespace="bench",
                netns=pod.path,
                ips=tuple(str(a.ip) for a in pod.addresses),
            )
        )
    cni = CNIRuntime(list(cfg.cni.bin_dirs), cfg.cni.cache_dir, executor=PluginExecutor(trust_files=False))
    svc = pod_service(cfg, pod_plan(cfg, cni), mode=mode_for(cfg))
    svc.roster.listed(listed)
    return svc


def _plugins(tmp: Path, host_side: bool) -> list[dict[str, Any]]:
    if not host_side:
        return [{"type": "bridge", "bridge": "nctbench0"}]
    ranges = [[{"subnet": "10.0.0.0/8"}], [{"subnet": "fd00::/8"}]]
    ipam = {"type": "host-local", "dataDir": str(tmp / "ipam"), "ranges": ranges}
    return [
        {"type": "bridge", "bridge": "nctbench0", "ipam": ipam},
        {"type": "portmap", "backend": "iptables", "capabilities": {"portMappings": True}},
    ]


def measure(pods: Sequence[BenchPod], rounds: int, *, host_side: bool = False) -> dict[str, Any]:
    """Median seconds of a full ServiceTimers.verify round over `pods` (after one warm-up round);
    `host_side`: with a route per family, a hostPort's DNAT rules (both families) and a lease
    per address of each pod."""
    families = sorted({a.version for p in pods for a in p.addresses}) if host_side else []
    rules = [DnatRules(pods, f) for f in families]
    try:
        for r in rules:
            r.make()
        return _measure(pods, rounds, host_side)
    finally:
        for r in rules:
            r.remove()


def _measure(pods: Sequence[BenchPod], rounds: int, host_side: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nct-verify-") as tmp:
        svc = build(pods, Path(tmp), host_side=host_side)

        async def run() -> tuple[list[float], int]:
            times, not_ok = [], 0
            try:
                for r in range(rounds + 1):
                    t0 = time.perf_counter()
                    verdicts = await svc.timers.verify()
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
                return {h.pod_id for h in await svc.timers.verify() if h.state is PodState.BROKEN}
            finally:
                await svc.close()

        broken = asyncio.run(run())
    return {p.netns for p in pods if pod_id(p) in broken}
