#!/usr/bin/env python3
"""The daemon's own figures: resident memory over a pod churn, and a restart with many pods
attached, until ready.

One daemon (mode native) against the runtime-side NRI double, driven over NRI only:

  memory   --churn pods (default 500) created and removed through NRI RunPodSandbox /
           StopPodSandbox + RemovePodSandbox, --parallel at a time (default 8). The daemon's
           VmRSS is read when it is idle after the first 10% of the pods, every 10% while the
           churn goes on, and idle at the end. Goals: < 40 MiB, the end within 10% of the first.
  restart  --attached pods (default 500) attached, then the daemon stopped (SIGTERM) and
           started again with the double listing all of them: "ready" is from the process's
           start until `nri-cni status` says it is synchronized (polled every 50 ms), "settled"
           until its GC after Synchronize is done. Goal: ready < 2 s. Verification of the
           attachments after a restart does not exist yet: the figure says "not verified".

The chain is three copies of a static C no-op plugin (bench_cni.py builds it) unless --chain
real (bridge + host-local + portmap): what is measured is the daemon's own memory and start-up,
not the plugins. With the no-op chain all pods share one netns (nothing is made in it).
Needs root. Run:  python bench/bench_daemon.py [--churn 500] [--attached 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_cni import build_noop  # noqa: E402
from bench.native_node import CNI_BIN, NativeNode, rss_kib  # noqa: E402
from tests.support.netns import Janitor  # noqa: E402

VERIFY = "not verified: no verify yet"


async def idle_rss(node: NativeNode) -> int:
    """VmRSS (KiB) once nothing is in flight."""
    deadline = time.monotonic() + 30
    while True:
        tracked = (await asyncio.to_thread(node.daemon.status))["tracked"]
        if tracked["operations"] == 0 and tracked["background"] == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the daemon did not become idle: {tracked}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    return rss_kib(node.daemon.proc.pid)


async def churn(node: NativeNode, nets, pods: int, parallel: int) -> dict:
    sem = asyncio.Semaphore(parallel)
    samples: list[tuple[int, int]] = []
    step = max(pods // 10, 1)
    done = 0

    async def cycle() -> None:
        nonlocal done
        async with sem:
            pod, _ = await node.run_pod(next(nets))
            await node.remove_pod(pod)
        done += 1
        if done % step == 0:
            samples.append((done, rss_kib(node.daemon.proc.pid)))

    t0 = time.perf_counter()
    await asyncio.gather(*(cycle() for _ in range(step)))
    first = await idle_rss(node)
    await asyncio.gather(*(cycle() for _ in range(pods - step)))
    end = await idle_rss(node)
    secs = time.perf_counter() - t0
    left = node.attached()
    if left:
        raise RuntimeError(f"{len(left)} pod(s) still attached after the churn")
    return {
        "pods": pods,
        "parallel": parallel,
        "seconds": secs,
        "first_idle_kib": first,
        "end_idle_kib": end,
        "max_kib": max([first, end] + [kib for _, kib in samples]),
        "samples": samples,
        "growth": end / first - 1,
    }


async def restart(node: NativeNode, conflist: dict, nets, attached: int) -> dict:
    sem = asyncio.Semaphore(8)

    async def one() -> None:
        async with sem:
            await node.run_pod(next(nets))

    await asyncio.gather(*(one() for _ in range(attached)))
    before = len(node.attached())
    if before != attached:
        raise RuntimeError(f"{before} pods attached, not {attached}")
    await node.stop()
    mark = node.log_size()
    t0 = time.perf_counter()
    ready = await node.start(conflist, pods=list(node.pods.values()))
    settled = await node.wait_log("gc: ", mark, timeout=120) - t0
    after = len(node.attached())
    if after != attached:
        raise RuntimeError(f"after the restart {after} pods are attached, not {attached}")
    return {
        "pods": attached,
        "ready_s": ready,
        "settled_s": max(settled, ready),
        "rss_kib": await idle_rss(node),
        "verified": VERIFY,
    }


def measure(args) -> dict:
    jan = Janitor()
    workdir = Path(tempfile.mkdtemp(prefix="nct-bench-daemon-"))
    jan.track_path(workdir)
    report: dict = {"chain": args.chain}
    problems: list[str] = []
    try:
        if args.chain == "noop":
            node = NativeNode(jan, [build_noop(workdir)])
            conflist = {
                "cniVersion": "1.1.0",
                "name": "nct-noop",
                "plugins": [{"type": "noop1"}, {"type": "noop2"}, {"type": "noop3"}],
            }
            shared = jan.netns().path
            nets = iter(lambda: shared, None)
        else:
            node = NativeNode(jan, [str(CNI_BIN)])
            conflist = node.bridge_list("nct-daemon")
            nets = iter([jan.netns().path for _ in range(args.churn + args.attached)])

        async def run() -> None:
            try:
                await node.start(conflist)
                report["memory"] = await churn(node, nets, args.churn, args.parallel)
                report["restart"] = await restart(node, conflist, nets, args.attached)
            finally:
                problems.extend(await node.drain())

        asyncio.run(run())
    finally:
        if "node" in locals():
            node.cleanup()
        problems += jan.cleanup()
    if problems:
        raise RuntimeError("bench_daemon: cleanup problems: " + "; ".join(problems))
    m, r = report["memory"], report["restart"]
    print(
        f"memory over a {m['pods']}-pod churn ({m['parallel']} at a time, {args.chain} chain, "
        f"{m['seconds']:.1f} s): idle after {m['pods'] // 10} pods {m['first_idle_kib'] / 1024:.1f} MiB, "
        f"idle at the end {m['end_idle_kib'] / 1024:.1f} MiB ({m['growth']:+.1%}), "
        f"max {m['max_kib'] / 1024:.1f} MiB (goal < 40 MiB, flat within 10%)"
    )
    print(
        f"restart with {r['pods']} pods attached: ready in {r['ready_s']:.2f} s, settled (GC after "
        f"Synchronize done) in {r['settled_s']:.2f} s, RSS {r['rss_kib'] / 1024:.1f} MiB; {r['verified']} "
        f"(goal ready < 2 s)"
    )
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--churn", type=int, default=500, help="pods created and removed (default 500)")
    ap.add_argument("--parallel", type=int, default=8, help="pods at a time in the churn (default 8)")
    ap.add_argument("--attached", type=int, default=500, help="pods attached at the restart (default 500)")
    ap.add_argument(
        "--chain", choices=("noop", "real"), default="noop", help="the pods' network (default noop)"
    )
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_daemon: needs root (netns)", file=sys.stderr)
        return 2
    report = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
