#!/usr/bin/env python3
"""Where one pod's RunPodSandbox goes in secondary mode, step by step.

The pod service of nri-cni, in this process, in secondary mode: the runtime's primary is a
libcni cache entry of a bridge list written here (containerd's, in a real node), nri-cni's
extra network a macvlan + host-local list over a veth master the bench made. Each pod gets a
netns of its own; `--pods` pods are attached one after another and then detached. Every step
of the attach is timed by wrapping the real object's method (wall time, medians over the pods):

  runtime cache read   RuntimePrimary.entry (containerd's libcni cache entry)
  select               PodPlan.select (config + annotation)
  intent write         IntentStore.write (atomic, fsynced)
  plugin execs         PluginExecutor.exec (macvlan, which runs host-local)
  cache write          CNIRuntime.cache_result
  FINALIZE primary     Attacher._finalize_primary (nothing to run without drop-ins)
  netlink fill         netlink.fill_interface_details (MAC/MTU from the pod's netns)
  intent clear         IntentStore.clear
  op record            OperationLog.emit

"whole attach" is PodVerbs.attach; "own" is it minus the plugin execs. The NRI round trip
is bench_ttrpc.py's figure (a bare request). Needs root. Subnet: a free /24.
Run:  python bench/profile_secondary.py [--pods 40]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nri_cni.cni.cache import CacheEntry, ResultCache  # noqa: E402
from nri_cni.cni.exec import PluginExecutor  # noqa: E402
from nri_cni.cni.runtime import CNIRuntime  # noqa: E402
from nri_cni.config import parse_config  # noqa: E402
from nri_cni.pod import attach as attach_module  # noqa: E402
from nri_cni.pod.model import PodInfo  # noqa: E402
from nri_cni.service.modes import mode_for  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402
from tests.support.names import free_subnet  # noqa: E402
from tests.support.pods import pod_plan, pod_service  # noqa: E402

STEPS = (
    "runtime cache read",
    "select",
    "intent write",
    "plugin execs",
    "cache write",
    "FINALIZE primary",
    "netlink fill",
    "intent clear",
    "op record",
)


class Clock:
    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.pod: dict[str, float] = {}

    def wrap(self, obj: Any, name: str, step: str) -> None:
        fn = getattr(obj, name)
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    self.pod[step] = self.pod.get(step, 0.0) + (time.perf_counter() - t0) * 1000

            setattr(obj, name, timed_async)
        else:

            @functools.wraps(fn)
            def timed(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.pod[step] = self.pod.get(step, 0.0) + (time.perf_counter() - t0) * 1000

            setattr(obj, name, timed)

    def pod_done(self) -> None:
        for step in (*STEPS, "whole attach"):
            self.ms[step].append(self.pod.get(step, 0.0))
        self.ms["own"].append(self.pod.get("whole attach", 0.0) - self.pod.get("plugin execs", 0.0))
        self.pod = {}


def primary_entry(pod: PodInfo, name: str) -> CacheEntry:
    """What containerd's libcni leaves for the pod's eth0 (a bridge list's result)."""
    conf = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "bridge", "bridge": "cni0"}]}
    return CacheEntry(
        container_id=pod.id,
        ifname="eth0",
        network_name=name,
        config=json.dumps(conf).encode(),
        netns=pod.netns,
        result={
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": pod.netns}],
            "ips": [{"address": "10.99.0.2/24", "interface": 0}],
        },
    )


async def run(
    args: argparse.Namespace, master: str, subnet: str, netns: list[str], tmp: Path
) -> dict[str, list[float]]:
    extra = {
        "cniVersion": "1.0.0",
        "name": "fastnet",
        "plugins": [
            {
                "type": "macvlan",
                "master": master,
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(tmp / "ipam"),
                    "ranges": [[{"subnet": subnet}]],
                },
            }
        ],
    }
    cfg = parse_config(
        {
            "mode": "secondary",
            "primary_network": "cbr0",
            "state_dir": str(tmp / "state"),
            "cni": {
                "bin_dirs": [str(REAL_PLUGINS)],
                "cache_dir": str(tmp / "cache"),
                "runtime_cache_dir": str(tmp / "rt"),
            },
            "networks": [{"name": "fastnet", "default": True, "conflist": extra}],
        },
        str(tmp / "c.yaml"),
    )
    cni = CNIRuntime([str(REAL_PLUGINS)], str(tmp / "cache"), executor=PluginExecutor())
    plan = pod_plan(cfg, cni)
    mode = mode_for(cfg)
    service = pod_service(cfg, plan, mode=mode)
    clock = Clock()
    clock.wrap(plan, "select", "select")
    clock.wrap(plan.intents, "write", "intent write")
    clock.wrap(plan.intents, "clear", "intent clear")
    clock.wrap(cni.executor, "exec", "plugin execs")
    clock.wrap(cni, "cache_result", "cache write")
    clock.wrap(plan.attacher, "_finalize_primary", "FINALIZE primary")
    clock.wrap(plan.oplog, "emit", "op record")
    clock.wrap(attach_module.netlink, "fill_interface_details", "netlink fill")
    runtime_read = mode.runtime_cache.read
    runtime_cache = ResultCache(str(tmp / "rt"))

    def timed_read(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return runtime_read(*a, **k)
        finally:
            clock.pod["runtime cache read"] = (time.perf_counter() - t0) * 1000

    object.__setattr__(mode.runtime_cache, "read", timed_read)
    pods = []
    for i, path in enumerate(netns):
        pod = PodInfo(uuid.uuid4().hex * 2, f"prof-{i}", "nct-bench", str(uuid.uuid4()), netns=path)
        runtime_cache.write(primary_entry(pod, "cbr0"))
        clock.pod = {}
        t0 = time.perf_counter()
        await service.verbs.attach(pod)
        clock.pod["whole attach"] = (time.perf_counter() - t0) * 1000
        if i >= args.warmup:
            clock.pod_done()
        pods.append(pod)
    for pod in pods:
        await service.verbs.detach(pod)
        runtime_cache.delete("cbr0", pod.id, "eth0")
    return clock.ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    jan = Janitor()
    with tempfile.TemporaryDirectory(prefix="nct-prof-") as tmp:
        try:
            # pyroute2's synchronous calls cannot run inside the event loop: netns first
            master, _ = jan.veth()
            netns = [jan.netns().path for _ in range(args.warmup + args.pods)]
            ms = asyncio.run(run(args, master, str(free_subnet()), netns, Path(tmp)))
        finally:
            problems = jan.cleanup()
    print(f"secondary mode, one extra network (macvlan + host-local), {args.pods} pods, medians:")
    for step in (*STEPS, "whole attach", "own"):
        values = ms[step]
        print(
            f"  {step:<20} {statistics.median(values):7.3f} ms   (p90 {sorted(values)[int(len(values) * 0.9)]:.3f})"
        )
    if problems:
        print(f"cleanup problems: {problems}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
