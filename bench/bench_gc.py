#!/usr/bin/env python3
"""GC of N stale attachments: the nri-cni daemon against libcni's GCNetworkList, and a pod ADD
that arrives while the daemon collects them against the same ADD on an idle daemon.

nri-cni: the daemon (mode native, bridge + host-local + portmap) attaches N pods through NRI
RunPodSandbox; it is stopped, the runtime double forgets the pods (removed while nri-cni was
down), the daemon is started again and its Synchronize lists none of them: the GC after
Synchronize DELs all N (their netns still exist, so every DEL does the full teardown) and runs
the plugins' GC verb. Timed from the double's Synchronize answered to the daemon's "gc: ..."
summary line in its log (polled every 5 ms). As soon as the daemon logs that GC began, the
double sends RunPodSandbox for a new pod: its time is the "ADD during GC" figure, against the
median of a few RunPodSandbox calls on the idle daemon before.

libcni: bench/libcni-driver (libcni 1.3.0, Go, from Debian's packages) adds N attachments of
the same list (its own bridge, subnet, IPAM dir and cache dir), then GCNetworkList with no valid
attachment, timed in Go around the call. Without Go the bench says so and the anchor is the
exec floor instead: the same N DELs by the minimal driver of bench_cni.py, one after another.

The profile: each side's CPU time for its GC (/proc/<pid>/stat, the children it waited for
included), and the busy ADD's time until its operation began and per plugin (the op lines).

The two sides take turns (--rounds: the order alternates). Needs root and .ci/install-deps.
Run:  python bench/bench_gc.py [--stale 40] [--rounds 1] [--parallel N]
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
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import golibcni  # noqa: E402
from bench.bench_cni import Floor  # noqa: E402
from bench.goals import GOALS  # noqa: E402
from bench.native_node import NativeNode  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.hostlocal import host_local_reservations  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402

GO_ARGS = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "nct-bench"), ("K8S_POD_NAME", "gc")]


async def nri_round(node: NativeNode, conflist: dict, nets, stale: int, idle_adds: int) -> dict:
    """One round on the daemon: idle ADDs, N attached, restart with none listed, GC + an ADD."""
    await node.start(conflist)
    idle = []
    idle_ids = set()
    for _ in range(idle_adds):
        pod, ms = await node.run_pod(next(nets))
        idle.append(ms)
        idle_ids.add(pod.id)
        await node.remove_pod(pod)
    for _ in range(stale):
        await node.run_pod(next(nets))
    await node.stop()
    stale_ids = {p.id for p in node.forget_pods()}
    mark = node.log_size()
    start = asyncio.create_task(node.start(conflist, pods=[]))
    await node.runtime.wait_plugin(node._starts + 1, timeout=60)  # Synchronize answered
    t0 = time.perf_counter()
    cpu0 = cpu_ms(node.daemon.proc.pid)
    await node.wait_log("gc (synchronize)", mark)  # GC has its lock: now a pod comes
    busy_ns = next(nets)
    t_add, sent = time.perf_counter(), time.time()
    add = asyncio.create_task(node.run_pod(busy_ns))
    t_gc_end = await node.wait_log("gc: ", mark)
    gc_cpu = cpu_ms(node.daemon.proc.pid) - cpu0
    pod, busy_ms = await add
    t_add_end = t_add + busy_ms / 1000
    await start
    ops = node.daemon.op_lines()
    deleted = [op for op in ops if op["op"] == "gc-del" and op["podId"] in stale_ids]
    busy_add = [op for op in ops if op["op"] == "add" and op["podId"] == pod.id]
    idle_ops = [op for op in ops if op["op"] == "add" and op["podId"] in idle_ids]
    await node.remove_pod(pod)
    if len(deleted) != stale:
        raise RuntimeError(f"the GC after Synchronize deleted {len(deleted)} stale pod(s), not {stale}")
    left = node.attached()
    if left:
        raise RuntimeError(f"nri-cni still has attachments after GC: {left}")
    await node.stop()
    return {
        "gc_ms": (t_gc_end - t0) * 1000,
        "gc_cpu_ms": gc_cpu,  # the daemon's and its plugins' CPU time (the ADD's included)
        "gc_dels": len(deleted),  # must be all of them
        # the DELs' own times (the daemon's op lines) over the GC's wall time: 1.0 when they
        # ran one after another, more when they overlapped
        "overlap": sum(op["ms"] for op in deleted) / ((t_gc_end - t0) * 1000),
        "idle_add_ms": idle,
        "busy_add_ms": busy_ms,
        "add_done_before_gc": t_add_end < t_gc_end,
        # the profile of a slow ADD: each plugin's time in the ADD during GC and in the idle
        # ones (the daemon's op lines), and how many DELs ran while it did
        "busy_add_plugins": plugin_ms(*busy_add),
        "idle_add_plugins": plugin_ms(*idle_ops),
        "dels_during_add": _overlapping(deleted, busy_add[0]) if busy_add else 0.0,
        # of the ADD's round trip: until the daemon began the operation (NRI, the event loop)
        "busy_add_before_op_ms": (busy_add[0]["start"] - sent) * 1000 if busy_add else 0.0,
        "busy_add_op_ms": busy_add[0]["ms"] if busy_add else 0.0,
    }


def cpu_ms(pid: int) -> float:
    """CPU time of a process and of the children it waited for (the plugins, and what they
    ran: iptables, IPAM), in ms (/proc/<pid>/stat utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


def plugin_ms(*ops: dict) -> dict[str, float]:
    """Median ms per plugin (and nri-cni's own rest) over ADD op lines."""
    per: dict[str, list[float]] = {}
    for op in ops:
        own = op["ms"]
        for p in op.get("plugins", []):
            per.setdefault(p["plugin"], []).append(p["ms"])
            own -= p["ms"]
        per.setdefault("nri-cni", []).append(own)
    return {k: round(statistics.median(v), 1) for k, v in per.items()}


def _overlapping(dels: list[dict], add: dict) -> float:
    """DELs running during the ADD, on average over its time (op lines' wall-clock spans)."""
    span = add["end"] - add["start"]
    if span <= 0:
        return 0.0
    return sum(max(0.0, min(d["end"], add["end"]) - max(d["start"], add["start"])) for d in dels) / span


def anchor_round(conflist: dict, nets, stale: int, driver: str, workdir: Path) -> dict:
    """libcni (or, without Go, the exec floor): N attachments, then collect them all."""
    if driver:
        go = golibcni.LibcniDriver(
            driver, [str(REAL_PLUGINS)], str(workdir / f"libcni-cache-{uuid.uuid4().hex[:6]}")
        )
        try:
            go.load("gc", conflist)
            for _ in range(stale):
                go.add("gc", f"nct-gc-{uuid.uuid4().hex[:16]}", next(nets), "eth0", GO_ARGS)
            cpu0 = cpu_ms(go.proc.pid)
            gc_ms = go.gc("gc", [])
            return {"gc_ms": gc_ms, "gc_cpu_ms": cpu_ms(go.proc.pid) - cpu0}
        finally:
            go.gc("gc", [])  # after a failure midway: nothing of ours stays attached
            go.close()
    floor = Floor(str(REAL_PLUGINS))
    args = ";".join(f"{k}={v}" for k, v in GO_ARGS)
    attached = []
    try:
        for _ in range(stale):
            st = (f"nct-gc-{uuid.uuid4().hex[:16]}", next(nets))
            attached.append((st, floor.add(conflist, st[0], st[1], "eth0", args, {})))
        t0 = time.perf_counter()
        while attached:
            (cid, ns), prev = attached[0]
            floor.delete(conflist, cid, ns, "eth0", args, {}, prev)
            attached.pop(0)
        return {"gc_ms": (time.perf_counter() - t0) * 1000}
    finally:
        for (cid, ns), prev in attached:
            floor.delete(conflist, cid, ns, "eth0", args, {}, prev)


def measure(args) -> dict:
    """Prints the figures, returns them (see the module docstring)."""
    report: dict = {"stale": args.stale, "rounds": args.rounds}
    driver = ""
    if not args.no_libcni:
        try:
            driver = golibcni.build()
            report["anchor"] = f"libcni GCNetworkList ({golibcni.versions()})"
        except golibcni.NoGo as exc:
            report["anchor_missing"] = str(exc)
            print(f"bench_gc: NO libcni anchor ({exc}): the exec floor instead", file=sys.stderr)
    if not driver:
        report["anchor"] = "exec floor: the same DELs one after another (no libcni)"
    jan = Janitor()
    workdir = Path(tempfile.mkdtemp(prefix="nct-bench-gc-"))
    jan.track_path(workdir)
    parallel = getattr(args, "parallel", 0)  # (python -m bench passes the sizes only)
    extra = {"gc": {"interval": 0, "parallel": parallel}} if parallel else {}
    node = NativeNode(jan, [str(REAL_PLUGINS)], **extra)
    problems: list[str] = []
    nri: list[dict] = []
    anchor: list[dict] = []

    async def rounds(conflist: dict, go_list: dict, nets) -> None:
        try:
            for r in range(args.rounds):
                for side in ["nri", "anchor"] if r % 2 == 0 else ["anchor", "nri"]:
                    if side == "nri":
                        nri.append(await nri_round(node, conflist, nets, args.stale, args.idle_adds))
                    else:
                        anchor.append(anchor_round(go_list, nets, args.stale, driver, workdir))
        finally:
            problems.extend(await node.drain())

    try:
        conflist = node.bridge_list("nct-gc")
        go_list = node.bridge_list("nct-gc-anchor")
        count = args.rounds * (2 * args.stale + args.idle_adds + 1)
        nets = iter([jan.netns().path for _ in range(count)])
        print(f"bench_gc: {count} netns ready", flush=True)
        asyncio.run(rounds(conflist, go_list, nets))
        for lst in (conflist, go_list):
            held = host_local_reservations(lst["plugins"][0]["ipam"]["dataDir"])
            if held:
                raise RuntimeError(f"host-local still holds {len(held)} address(es) of {lst['name']}")
    finally:
        node.cleanup()
        problems += jan.cleanup()
    if problems:
        raise RuntimeError("bench_gc: cleanup problems: " + "; ".join(problems))
    nri_gc = statistics.median(r["gc_ms"] for r in nri)
    anchor_gc = statistics.median(r["gc_ms"] for r in anchor)
    idle = statistics.median(ms for r in nri for ms in r["idle_add_ms"])
    busy = statistics.median(r["busy_add_ms"] for r in nri)
    report.update(
        nri=nri,
        anchor_rounds=anchor,
        nri_gc_ms=nri_gc,
        anchor_gc_ms=anchor_gc,
        speedup=anchor_gc / nri_gc,
        idle_add_ms=idle,
        busy_add_ms=busy,
        busy_over_idle=busy / idle,
        overlap=statistics.median(r["overlap"] for r in nri),
        nri_gc_cpu_ms=statistics.median(r["gc_cpu_ms"] for r in nri),
        anchor_gc_cpu_ms=statistics.median(r.get("gc_cpu_ms", 0.0) for r in anchor),
        cpus=os.cpu_count(),
    )
    print(
        f"GC of {args.stale} stale attachments: nri-cni {nri_gc:.0f} ms "
        f"({nri_gc / args.stale:.1f} ms each), {report['anchor']} {anchor_gc:.0f} ms: "
        f"nri-cni {anchor_gc / nri_gc:.2f}x as fast (goal `gc` {GOALS['gc'].text})"
    )
    print(
        f"pod ADD during that GC: {busy:.0f} ms, idle {idle:.1f} ms: {busy / idle:.1f}x "
        f"(goal `add_during_gc` {GOALS['add_during_gc'].text}); done before the GC: {[r['add_done_before_gc'] for r in nri]}"
    )
    print(
        f"  CPU: nri-cni's GC {report['nri_gc_cpu_ms']:.0f} ms of CPU in {nri_gc:.0f} ms "
        f"({report['nri_gc_cpu_ms'] / nri_gc:.2f} of {report['cpus']} CPUs busy), the anchor "
        f"{report['anchor_gc_cpu_ms']:.0f} ms in {anchor_gc:.0f} ms "
        f"({report['anchor_gc_cpu_ms'] / anchor_gc:.2f}); DELs overlapped {report['overlap']:.1f}x"
    )
    for r in nri:
        print(
            f"  ADD during GC {r['busy_add_ms']:.0f} ms (to the operation's start "
            f"{r['busy_add_before_op_ms']:.0f} ms, the operation {r['busy_add_op_ms']:.0f} ms), "
            f"{r['dels_during_add']:.1f} pods' DELs beside it: "
            f"{r['busy_add_plugins']} (idle: {r['idle_add_plugins']})"
        )
    return report


def why_gc(rep: dict) -> str:
    """The profile of the GC row: per attachment, the overlap, and the CPU each side used."""
    n = rep["stale"]
    return (
        f"{rep['nri_gc_ms'] / n:.1f} ms per stale attachment (libcni {rep['anchor_gc_ms'] / n:.1f} ms, one "
        f"after another); the daemon's DELs overlapped {rep['overlap']:.1f}x; CPU: nri-cni "
        f"{rep['nri_gc_cpu_ms']:.0f} ms in {rep['nri_gc_ms']:.0f} ms ({rep['nri_gc_cpu_ms'] / rep['nri_gc_ms']:.2f} "
        f"of {rep['cpus']} CPUs), libcni {rep['anchor_gc_cpu_ms']:.0f} ms in {rep['anchor_gc_ms']:.0f} ms: "
        f"at best {rep['anchor_gc_ms'] * rep['cpus'] / max(rep['nri_gc_cpu_ms'], 1):.1f}x on "
        f"{rep['cpus']} CPUs with nothing else running"
    )


def why_add(rep: dict) -> str:
    """The profile of the ADD-during-GC row: whether it waited, and where its time went."""
    done = all(r["add_done_before_gc"] for r in rep["nri"])
    head = (
        f"the ADD finished before the GC ({rep['nri_gc_ms']:.0f} ms) in every round"
        if done
        else f"the ADD finished after the GC ({rep['nri_gc_ms']:.0f} ms) in some round"
    )
    mid = sorted(rep["nri"], key=lambda r: r["busy_add_ms"])[len(rep["nri"]) // 2]
    return (
        f"{head}; the median one: {mid['busy_add_before_op_ms']:.0f} ms until the operation began, "
        f"plugins {mid['busy_add_plugins']} beside {mid['dels_during_add']:.0f} pods' DELs begun (GC starts "
        "no plugin of theirs while a pod operation waits or runs, and one a turn of its event loop) "
        f"(idle {mid['idle_add_plugins']}): the CPUs and the kernel shared with the GC plugins "
        "already running when it came"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stale", type=int, default=40, help="stale attachments per GC (default 40)")
    ap.add_argument("--rounds", type=int, default=1, help="GCs per side, order alternating (default 1)")
    ap.add_argument("--idle-adds", type=int, default=5, help="idle RunPodSandbox calls per round (default 5)")
    ap.add_argument(
        "--parallel",
        type=int,
        default=0,
        help="the daemon's gc.parallel (default: its own, sized for the machine)",
    )
    ap.add_argument("--no-libcni", action="store_true", help="the exec floor as the anchor, not libcni")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_gc: needs root (netns, veth, iptables)", file=sys.stderr)
        return 2
    report = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
