#!/usr/bin/env python3
"""The daemon's own figures: resident memory over a pod churn, and a restart with many pods
attached, until ready.

One daemon (mode native) against the runtime-side NRI double, driven over NRI only:

  memory   --churn pods (default 500) created and removed through NRI RunPodSandbox /
           StopPodSandbox + RemovePodSandbox, --parallel at a time (default 8). The daemon's
           VmRSS is read when it is idle after the first 10% of the pods, every 10% while the
           churn goes on, and idle at the end. Goal `memory` (bench/goals.py).
  restart  --attached pods (default 500) attached, then the daemon stopped (SIGTERM) and
           started again with the double listing all of them: "ready" is from the process's
           start until `nri-cni status` says it is synchronized (polled every 50 ms), "settled"
           until its GC after Synchronize is done, "verified" until `nri-cni status` shows a
           verify round finished since that start (polled every 10 ms; docs/reliability.md
           §10), with the pods' verdicts then, "checked" until that round's share of CHECKs
           (which follows the round: status `checksDone`) is done too. Goal `restart`. A
           daemon without verify gets "not measured: no verify", never a number.
  rounds   after the restart, --cadence-rounds (default 10, the default verify.check_every)
           verify rounds one after another through `nri-cni verify` (all pods, no forced
           CHECK): each is a round as the timer runs it, netlink and the host side for every
           pod, the client's time around it (what `nri-cni verify` waits for); the CNI CHECKs
           of the attachments whose turn it is (1 in check_every, by a stable hash of the
           attachment) follow the round, and the next round starts once status says they are
           done (`checksDone`, from the round's start), as the timer's interval leaves them
           time. Over check_every rounds every attachment is CHECKed once. Goal
           `verify_cadence` (the round).

The memory churn's chain is three copies of a static C no-op plugin (bench_cni.py builds it)
unless --chain real (bridge + host-local + portmap): what is measured is the daemon's own
memory, not the plugins; all pods share one netns (nothing is made in it). The restart's chain
is real unless --restart-chain noop: verify compares each pod's netns with its records, so the
pods must really have their interfaces (a netns each); with the no-op chain verify would find
every pod damaged. The real restart chain is dual-stack (an IPv4 and an IPv6 host-local range:
every pod has an address of each) unless --ipv4-only. NRI carries no port mappings, so these
pods have no hostPort (bench_verify's host-side row has them). Needs root. Run:
  python bench/bench_daemon.py [--churn 500] [--attached 500] [--parts memory,restart]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_cni import build_noop  # noqa: E402
from bench.goals import GOALS  # noqa: E402
from bench.native_node import NativeNode, rss_kib  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402

NO_VERIFY = "not measured: no verify"
PROBE_POD = "bench-probe/no-such-pod"  # asks whether the daemon has verify without running one


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


def has_verify(node: NativeNode) -> bool:
    """True if the running daemon has `nri-cni verify` (asked for a pod that does not exist, so
    nothing is verified): a daemon without it answers "unknown operation" or "has no verify"."""
    from nri_cni.local import proto as localproto  # lazy: only the restart bench asks

    body = json.dumps({"pod": PROBE_POD}).encode()
    status, payload = localproto.call(node.daemon.socket, {localproto.OP_KEY: "verify"}, body, timeout=60)
    error = str((json.loads(payload or b"{}") or {}).get("error", "")) if status else ""
    return status == 0 or error.startswith("no pod")


async def until_verified(node: NativeNode, t0: float, timeout: float = 120) -> tuple[float, dict]:
    """Seconds from t0 until status shows a verify round finished since the start; the status."""
    deadline = time.monotonic() + timeout
    while True:
        status = await asyncio.to_thread(node.daemon.status)
        if (status.get("verify") or {}).get("verified"):
            return time.perf_counter() - t0, status
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no verify round finished {timeout} s after the restart: {status.get('verify')}"
            )
        await asyncio.sleep(0.01)


async def until_checked(node: NativeNode, wall0: float, round_no: int, timeout: float = 300) -> float:
    """Seconds from wall0 (time.time()) until status says the CHECKs of verify round `round_no`
    (which follow the round) were done: its `checksDone`, polled every 10 ms."""
    deadline = time.monotonic() + timeout
    while True:
        st = (await asyncio.to_thread(node.daemon.status))["verify"]
        if st["checkedRounds"] >= round_no:
            return st["checksDone"] - wall0
        if time.monotonic() > deadline:
            raise RuntimeError(f"the CHECKs of verify round {round_no} still run {timeout} s later: {st}")
        await asyncio.sleep(0.01)


async def cadence_rounds(node: NativeNode, conflist: dict, rounds: int) -> dict:
    """`rounds` verify rounds on demand, one after another: (client) seconds of each, the
    netlink part (status lastRoundSeconds), when its CHECKs were done (from its start), the
    CHECKs each ran (the policy's hash)."""
    from nri_cni.local import proto as localproto  # lazy: only this part asks
    from nri_cni.node import VerifyPolicy

    policy = VerifyPolicy(check_every=10)
    keys = [f"{pid}/{conflist['name']}/eth0" for pid in node.pods]
    body = json.dumps({"pod": None, "check": False}).encode()
    out: dict = {"seconds": [], "netlink_s": [], "checked_s": [], "checks": []}
    for _ in range(rounds):
        t0, wall0 = time.perf_counter(), time.time()
        status, payload = await asyncio.to_thread(
            localproto.call, node.daemon.socket, {localproto.OP_KEY: "verify"}, body, timeout=300
        )
        out["seconds"].append(time.perf_counter() - t0)
        verdicts = json.loads(payload or b"[]")
        if status or len(verdicts) != len(keys) or any(v.get("state") != "ok" for v in verdicts):
            raise RuntimeError(f"a verify round on demand judged intact pods: {str(verdicts)[:500]}")
        st = (await asyncio.to_thread(node.daemon.status))["verify"]
        out["netlink_s"].append(st["lastRoundSeconds"])
        out["checked_s"].append(await until_checked(node, wall0, st["rounds"]))
        out["checks"].append(sum(policy.check_due(k, st["rounds"]) for k in keys))
    return out


async def restart(node: NativeNode, conflist: dict, nets, attached: int, cadence: int = 0) -> dict:
    sem = asyncio.Semaphore(8)

    async def one() -> None:
        async with sem:
            await node.run_pod(next(nets))

    await asyncio.gather(*(one() for _ in range(attached)))
    before = len(node.attached())
    if before != attached:
        raise RuntimeError(f"{before} pods attached, not {attached}")
    verify = await asyncio.to_thread(has_verify, node)
    await node.stop()
    mark = node.log_size()
    t0, wall0 = time.perf_counter(), time.time()
    ready = await node.start(conflist, pods=list(node.pods.values()))
    out: dict = {"pods": attached, "ready_s": ready, "verified_s": None, "verified": NO_VERIFY}
    if verify:
        verified, status = await until_verified(node, t0)
        rounds = status["verify"]
        wrong = {k: n for k, n in status.get("podStates", {}).items() if n and k != "ok"}
        if wrong:  # intact pods: a verify that finds fault with them measured nothing worth a figure
            raise RuntimeError(
                f"after the restart verify judged intact pods {wrong}:\n{node.daemon.log_tail()}"
            )
        out.update(
            verified_s=verified,
            round_s=rounds["lastRoundSeconds"],
            states=status.get("podStates", {}),
            verified=f"verified in {verified:.2f} s (its round {rounds['lastRoundSeconds']:.3f} s; "
            + ", ".join(f"{n} {state}" for state, n in status.get("podStates", {}).items() if n)
            + ")",
            checked_s=await until_checked(node, wall0, 1),
        )
    settled = await node.wait_log("gc: ", mark, timeout=120) - t0
    after = len(node.attached())
    if after != attached:
        raise RuntimeError(f"after the restart {after} pods are attached, not {attached}")
    out.update(settled_s=max(settled, ready), rss_kib=await idle_rss(node))
    if verify and cadence:
        out["rounds"] = await cadence_rounds(node, conflist, cadence)
    return out


def _noop_node(jan: Janitor, workdir: Path) -> tuple[NativeNode, dict, object]:
    node = NativeNode(jan, [build_noop(workdir)])
    conflist = {
        "cniVersion": "1.1.0",
        "name": "nct-noop",
        "plugins": [{"type": "noop1"}, {"type": "noop2"}, {"type": "noop3"}],
    }
    shared = jan.netns().path
    return node, conflist, iter(lambda: shared, None)


def _real_node(
    jan: Janitor, pods: int, name: str, dual_stack: bool = False
) -> tuple[NativeNode, dict, object]:
    node = NativeNode(jan, [str(REAL_PLUGINS)])
    conflist = node.bridge_list(name, dual_stack=dual_stack)
    return node, conflist, iter([jan.netns().path for _ in range(pods)])


def measure(args) -> dict:
    parts = set(getattr(args, "parts", "memory,restart").split(","))
    restart_chain = getattr(args, "restart_chain", "real")
    jan = Janitor()
    workdir = Path(tempfile.mkdtemp(prefix="nct-bench-daemon-"))
    jan.track_path(workdir)
    report: dict = {"chain": args.chain, "restart_chain": restart_chain}
    problems: list[str] = []
    nodes: list[NativeNode] = []
    try:
        if "memory" in parts:
            node, conflist, nets = (
                _noop_node(jan, workdir)
                if args.chain == "noop"
                else _real_node(jan, args.churn, "nct-daemon")
            )
            nodes.append(node)

            async def run_memory() -> None:
                try:
                    await node.start(conflist)
                    report["memory"] = await churn(node, nets, args.churn, args.parallel)
                finally:
                    problems.extend(await node.drain())

            asyncio.run(run_memory())
        if "restart" in parts:
            rnode, rconflist, rnets = (
                _noop_node(jan, workdir)
                if restart_chain == "noop"
                else _real_node(jan, args.attached, "nct-restart", not getattr(args, "ipv4_only", False))
            )
            nodes.append(rnode)

            async def run_restart() -> None:
                try:
                    await rnode.start(rconflist)
                    report["restart"] = await restart(
                        rnode, rconflist, rnets, args.attached, getattr(args, "cadence_rounds", 10)
                    )
                finally:
                    problems.extend(await rnode.drain())

            asyncio.run(run_restart())
    finally:
        for node in nodes:
            node.cleanup()
        problems += jan.cleanup()
    if problems:
        raise RuntimeError("bench_daemon: cleanup problems: " + "; ".join(problems))
    if "memory" in report:
        m = report["memory"]
        print(
            f"memory over a {m['pods']}-pod churn ({m['parallel']} at a time, {args.chain} chain, "
            f"{m['seconds']:.1f} s): idle after {m['pods'] // 10} pods {m['first_idle_kib'] / 1024:.1f} MiB, "
            f"idle at the end {m['end_idle_kib'] / 1024:.1f} MiB ({m['growth']:+.1%}), "
            f"max {m['max_kib'] / 1024:.1f} MiB (goal `memory` {GOALS['memory'].text})"
        )
    if "restart" in report:
        r = report["restart"]
        print(
            f"restart with {r['pods']} pods attached ({restart_chain} chain): ready in {r['ready_s']:.2f} s, "
            f"{r['verified']}, settled (GC after Synchronize done) in {r['settled_s']:.2f} s, "
            f"RSS {r['rss_kib'] / 1024:.1f} MiB (goal `restart` {GOALS['restart'].text})"
            + (f"; its round's CHECKs done at {r['checked_s']:.2f} s" if r.get("checked_s") else "")
        )
        if r.get("rounds"):
            c = r["rounds"]
            print(
                f"{len(c['seconds'])} verify rounds on demand, one after another (CHECK cadence on): "
                f"the round (what nri-cni verify waits for) median {statistics.median(c['seconds']) * 1e3:.0f} ms, "
                f"mean {statistics.mean(c['seconds']) * 1e3:.0f} ms, max {max(c['seconds']) * 1e3:.0f} ms; "
                f"netlink and host side median {statistics.median(c['netlink_s']) * 1e3:.0f} ms; "
                f"its CHECKs done at median {statistics.median(c['checked_s']) * 1e3:.0f} ms, "
                f"mean {statistics.mean(c['checked_s']) * 1e3:.0f} ms, max {max(c['checked_s']) * 1e3:.0f} ms "
                f"from its start; CHECKs per round {c['checks']} "
                f"(goal `verify_cadence` {GOALS['verify_cadence'].text})"
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
    ap.add_argument(
        "--restart-chain",
        choices=("noop", "real"),
        default="real",
        help="the restart's pods' network (default real: verify needs real interfaces)",
    )
    ap.add_argument("--parts", default="memory,restart", help="memory, restart or both (default both)")
    ap.add_argument(
        "--ipv4-only", action="store_true", help="the restart's pods IPv4 only (default dual-stack)"
    )
    ap.add_argument(
        "--cadence-rounds", type=int, default=10, help="verify rounds on demand after the restart (0: none)"
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
