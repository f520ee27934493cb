"""`python -m bench`: every bench with short defaults, then ONE table of its rows:
figure, nri-cni, anchor, ratio, goal, met. Each ratio comes from one bench that measured both
sides side by side in this run; the load average is read before and after each bench and
printed next to its rows (a 2-CPU machine shared with other jobs moves every figure).

  --smoke     tiny sizes, for CI: checks that every bench still works, not the goals
  --full      the sizes of docs/performance.md
  --only      a comma-separated subset: cni, gc, pods, crio, daemon, verify, attach, ttrpc,
              containers
  --markdown FILE / --json FILE   the table (and every figure) written out as well
  --write-doc the table, its command, date and `uptime` into docs/performance.md's table section
  --write-goals  only write bench/goals.py's goal table into bench/README.md and docs/performance.md

Each bench holds the machine's lock while it runs (tests/support/machine.py): no integration
test or bench of another run on this machine goes on beside it, either way.
A bench that fails is reported as FAILED in its rows, the others still run, and the exit
status is 1. Goals missed or not measured do not change the exit status (only --strict makes
them). The goals are bench/goals.py's.
Needs root and .ci/install-deps; libcni's driver is built by bench/go-toolchain.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import goals  # noqa: E402
from tests.support.machine import machine_turn  # noqa: E402

SIZES = {
    "smoke": {
        "cni": {"pods": 3, "warmup": 1},
        "gc": {"stale": 4, "idle_adds": 2, "rounds": 1},
        "pods": {"pods": 2, "warmup": 1, "burst": 8, "burst_parallel": 4},
        "crio": {"pods": 2, "warmup": 1},
        "daemon": {"churn": 40, "attached": 40},
        "verify": {"pods": 20, "rounds": 1},
        "attach": {"pods": 2, "warmup": 1, "containerd_pods": 2},
        "ttrpc": {"n": 200},
        "containers": {"containers": 2, "warmup": 1, "pods": 1},
    },
    "short": {
        "cni": {"pods": 20, "warmup": 3},
        "gc": {"stale": 40, "idle_adds": 5, "rounds": 1},
        "pods": {"pods": 20, "warmup": 3, "burst": 32, "burst_parallel": 8},
        "crio": {"pods": 20, "warmup": 3},
        "daemon": {"churn": 500, "attached": 500},
        "verify": {"pods": 500, "rounds": 3},
        "attach": {"pods": 20, "warmup": 2, "containerd_pods": 20},
        "ttrpc": {"n": 2000},
        "containers": {"containers": 40, "warmup": 3, "pods": 4},
    },
    "full": {
        "cni": {"pods": 50, "warmup": 3},
        "gc": {"stale": 40, "idle_adds": 5, "rounds": 3},
        "pods": {"pods": 40, "warmup": 3, "burst": 32, "burst_parallel": 8},
        "crio": {"pods": 40, "warmup": 3},
        "daemon": {"churn": 500, "attached": 500},
        "verify": {"pods": 500, "rounds": 5},
        "attach": {"pods": 40, "warmup": 3, "containerd_pods": 40},
        "ttrpc": {"n": 5000},
        "containers": {"containers": 80, "warmup": 3, "pods": 4},
    },
}
BENCHES = ("cni", "gc", "pods", "crio", "daemon", "verify", "attach", "ttrpc", "containers")


@dataclass
class Row:
    figure: str
    nri: str
    anchor: str
    ratio: str
    key: str  # its goal in bench/goals.py, "-" for none
    met: str  # bench/goals.py: "yes", "NO", "-" (no goal), "FAILED", "not measured"
    load: str = ""
    why: str = ""  # what the bench's own profile says about the figure (printed when missed)

    @property
    def goal(self) -> str:
        return goals.GOALS[self.key].text if self.key in goals.GOALS else "-"


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


# -- one function per bench: run it, turn its report into rows --------------------------------


def run_cni(size: dict) -> list[Row]:
    from bench import bench_cni

    args = Namespace(chains="real,noop", rounds=1, no_libcni=False, json=None, **size)
    rep = bench_cni.measure(args)
    real, noop = rep["chains"]["real"]["summary"]["ADD"], rep["chains"]["noop"]["summary"]
    lo, hi = real["median_paired_ratio_ci95"]
    r = real["median_paired_ratio"]
    rows = [
        Row(
            "CNI runtime, real chain ADD vs exec floor (paired median)",
            f"{real['nri_median_ms']:.2f} ms",
            f"floor {real['floor_median_ms']:.2f} ms",
            f"{r:.3f} (95% CI {lo:.3f}-{hi:.3f})",
            "cni_floor",
            goals.met("cni_floor", r),
            why=f"per-pod difference {real['median_paired_diff_ms']:+.2f} ms; the interval shows how "
            "far this machine's noise alone moves the median",
        )
    ]
    if "libcni_median_ms" in real:
        g = real["median_paired_ratio_libcni"]
        rows.append(
            Row(
                "CNI runtime, real chain ADD vs libcni AddNetworkList (paired median)",
                f"{real['nri_median_ms']:.2f} ms",
                f"libcni {real['libcni_median_ms']:.2f} ms",
                f"{g:.3f}",
                "cni_libcni",
                goals.met("cni_libcni", g),
                why="libcni's time is taken inside Go around AddNetworkList (no pipe, no event loop); "
                f"nri-cni's own part per plugin call on the no-op chain: {noop['ADD']['own_ms_per_call']:.3f} ms",
            )
        )
    else:
        rows.append(
            Row(
                "CNI runtime vs libcni",
                "-",
                f"NO libcni: {rep.get('libcni_missing', '?')[:60]}",
                "-",
                "cni_libcni",
                goals.met("cni_libcni", None),
            )
        )
    own = noop["ADD"]["own_ms_per_call"]
    rows.append(
        Row(
            "own cost per plugin call (3 no-op plugins, ADD; DEL)",
            f"{own:.3f} ms; {noop['DEL']['own_ms_per_call']:.3f} ms",
            f"floor ADD {noop['ADD']['floor_median_ms']:.2f} ms / 3 calls",
            "-",
            "own_call",
            goals.met("own_call", own),
            why="what nri-cni adds per call (ADD: conflist injection, result parsing, the cache write; "
            "DEL: the cache read and unlink), by bench/profile_cni.py's cProfile of the same chain: "
            f"{_own_cost_profile(size)}; no one part dominates: the bound is the Python work of "
            "an asyncio child process (loop wakeups, its fds, JSON), which the exec floor's blocking "
            "waitpid does not pay",
        )
    )
    return rows


def _own_cost_profile(size: dict) -> str:
    """bench/profile_cni.py's shares of nri-cni's own time per call, as one phrase."""
    import shutil
    import tempfile

    from bench import profile_cni
    from bench.bench_cni import build_noop

    work = Path(tempfile.mkdtemp(prefix="nct-prof-", dir="/dev/shm"))
    try:
        shares = profile_cni.profile_noop(build_noop(work), max(20, size["pods"] * 4), str(work / "cache"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return profile_cni.describe(shares)


def run_gc(size: dict) -> list[Row]:
    from bench import bench_gc

    rep = bench_gc.measure(Namespace(no_libcni=False, **size))
    n = rep["stale"]
    anchor = "libcni GCNetworkList" if "libcni" in rep["anchor"] else "exec floor (NO libcni)"
    return [
        Row(
            f"GC of {n} stale attachments (bridge + host-local + portmap)",
            f"{rep['nri_gc_ms']:.0f} ms",
            f"{anchor} {rep['anchor_gc_ms']:.0f} ms",
            f"{rep['speedup']:.2f}x as fast",
            "gc",
            goals.met("gc", rep["speedup"] if "libcni" in rep["anchor"] else None),
            why=bench_gc.why_gc(rep),
        ),
        Row(
            f"pod ADD while the daemon GCs {n} stale attachments",
            f"{rep['busy_add_ms']:.0f} ms",
            f"idle ADD {rep['idle_add_ms']:.1f} ms",
            f"{rep['busy_over_idle']:.1f}x",
            "add_during_gc",
            goals.met("add_during_gc", rep["busy_over_idle"]),
            why=bench_gc.why_add(rep),
        ),
    ]


def run_pods(size: dict) -> list[Row]:
    from bench import bench_pods
    from bench.bench_pods import describe_interval

    rep = bench_pods.measure(Namespace(part="all", no_base=False, host_ports=False, json=None, **size))
    p1, p2 = rep["shim_vs_native"], rep["secondary_vs_native2"]
    c1, c2 = p1["compare"], p2["compare"]
    sec = c2["secondary_extra_over_base_ms"]["run"]
    nat = c2["native2_extra_over_base_ms"]["run"]
    extra_ratio = sec / nat if nat > 0 else None
    burst = p2.get("burst")

    def own(mode: dict) -> str:
        add = mode.get("nri_cni_ops", {}).get("add")
        if not add:
            return ""
        return (
            f"nri-cni's ADD {add['median_ms']:.1f} ms, of which plugins {add['plugins_median_ms']:.1f} ms "
            f"and nri-cni itself {add['own_median_ms']:.1f} ms"
        )

    sec_own = own(p2["modes"]["secondary"])
    rows = [
        Row(
            "secondary mode: cost of one extra network (RunPodSandbox over containerd with eth0 only)",
            f"{sec:+.1f} ms",
            f"containerd's own 2nd network {nat:+.1f} ms",
            f"{extra_ratio:.2f}" if extra_ratio is not None else "- (anchor <= 0: noise)",
            "secondary_extra",
            goals.met_ratio("secondary_extra", sec, nat),
            why=f"{sec_own}; the rest is the NRI round trip and containerd's side of it; containerd "
            "ADDs its two networks at once (go-cni), an NRI plugin's comes after eth0",
        ),
    ]
    serial = c2.get("native2s_extra_over_base_ms", {}).get("run")
    if serial is not None:
        ratio_s = sec / serial if serial > 0 else None
        rows.append(
            Row(
                "secondary mode: cost of one extra network vs containerd's 2nd network set up after eth0",
                f"{sec:+.1f} ms",
                f"containerd (cni.setup_serially) {serial:+.1f} ms",
                f"{ratio_s:.2f}" if ratio_s is not None else "- (anchor <= 0: noise)",
                "secondary_extra_serial",
                goals.met_ratio("secondary_extra_serial", sec, serial),
                why=sec_own,
            )
        )
    if burst:
        rows.append(
            Row(
                f"secondary mode: pods/s, {size['burst']} pods {size['burst_parallel']} at a time",
                f"{burst['secondary']:.1f} pods/s",
                f"containerd's own 2nd network {burst['native2']:.1f} pods/s",
                f"{burst['ratio']:.3f}",
                "secondary_burst",
                goals.met("secondary_burst", burst["ratio"]),
                why=f"containerd serializes NRI calls: {sec_own} per pod on that path",
            )
        )
    native = p1["modes"]["native"]["run"]["median"]
    floor = p1["floor"]
    why = (
        f"{own(p1['modes']['shim'])}; bench/profile_pod.py's timeline names the steps of the rest; a shim "
        f"set-up doing nothing (the floor row) is {bounded(floor, 'floor_vs_own', 'run')} of containerd's own"
        + spread(c1["run_median_ratio_interval"])
    )
    rows.append(
        Row(
            "pod creation: the floor of a shim set-up, containerd's own CNI with the compiled shim chained after "
            "portmap (answered at once by bench/null_plugin.py, which also hears the NRI pod events, doing "
            "nothing) vs containerd's own CNI (RunPodSandbox medians)",
            f"{floor['floor_run_median_ms']:.1f} ms",
            f"containerd {native:.1f} ms",
            f"{floor['floor_vs_own']['run']:.3f}",
            "floor",
            goals.met("floor", floor["floor_vs_own"]["run"]),
            why=f"the ratio's {describe_interval(floor['floor_vs_own_interval']['run'])}; nri-cni's shim over "
            f"this floor: {bounded(floor, 'shim_vs_floor', 'run')}",
        )
    )
    rows.append(
        Row(
            "pod creation, shim vs containerd's own CNI (RunPodSandbox median)",
            f"{p1['modes']['shim']['run']['median']:.1f} ms",
            f"containerd {native:.1f} ms",
            f"{c1['run_median_ratio']:.3f} (per-pod {c1['run_per_pod_ratio_median']:.3f})",
            "creation",
            goals.met("creation", c1["run_median_ratio"]),
            why=why,
        )
    )
    return rows


def spread(interval: tuple[float, float]) -> str:
    """How far the row's one run can be trusted (bench_pods.ratio_interval)."""
    from bench.bench_pods import describe_interval

    return f"; the ratio's {describe_interval(interval)} (bootstrap over this run's pods)"


def bounded(floor: dict, side: str, what: str) -> str:
    """A floor ratio (bench_pods.floor_compare) with its 95 % interval: side `floor_vs_own` or
    `shim_vs_floor`, what `run` or `stop_remove`."""
    from bench.bench_pods import with_interval

    return with_interval(floor[side][what], floor[side + "_interval"][what])


def run_crio(size: dict) -> list[Row]:
    """bench_pods' rows on CRI-O 1.36 (bench_crio.py): both sides alternated in one run."""
    from bench import bench_crio
    from bench.bench_pods import describe_interval, with_interval
    from tests.support.crio import available

    if not available():
        why = "no CRI-O (.ci/install-deps unpacks it from $NRI_CNI_CRIO_DIR)"
        return [
            Row(f"CRI-O: {goals.GOALS[k].about}", "-", why, "-", k, goals.met(k, None), why=why)
            for k in ("crio_creation", "crio_stop_remove")
        ]
    rep = bench_crio.measure(Namespace(part="all", host_ports=False, json=None, **size))
    p1, p2 = rep["shim_vs_crio"], rep["secondary_vs_base"]
    c1, c2 = p1["compare"], p2["compare"]
    shim, own = p1["modes"]["crio-shim"], p1["modes"]["crio"]
    fwd = p1["forwarded"]
    sec_add = p2["modes"]["crio-sec"].get("nri_cni_ops", {}).get("add", {})
    floor = p1["floor"]
    floor_why = (
        f"; a shim set-up doing nothing (the floor row) is {bounded(floor, 'floor_vs_own', 'run')} of CRI-O's "
        f"own for the creation, {bounded(floor, 'floor_vs_own', 'stop_remove')} for stop+remove"
    )
    return [
        Row(
            "CRI-O: pod creation, shim vs CRI-O's own CNI (RunPodSandbox median); NOT the same work: "
            "nri-cni answers CRI-O's CHECK after ADD from its records, CRI-O's own network runs the plugins' CHECK",
            f"{shim['run']['median']:.1f} ms",
            f"CRI-O {own['run']['median']:.1f} ms",
            f"{c1['run_median_ratio']:.3f} (per-pod {c1['run_per_pod_ratio_median']:.3f})",
            "crio_creation_records",
            goals.met("crio_creation_records", c1["run_median_ratio"]),
            why=f"CHECK answered from the records for {p1['checks_from_records']} of {p1['checks']} pods",
        ),
        Row(
            "CRI-O: pod creation with the plugins' CHECK forwarded, shim vs CRI-O's own CNI (the same work; "
            "per pod: RunPodSandbox - the CHECK from records + the plugins' CHECK as nri-cni runs it)",
            f"{fwd['run_median']:.1f} ms",
            f"CRI-O {own['run']['median']:.1f} ms",
            f"{fwd['run_median_ratio']:.3f}",
            "crio_creation",
            goals.met("crio_creation", fwd["run_median_ratio"]),
            why=f"the CHECK from records {fwd['records_check_median_ms']:.2f} ms (decoded -> answered), the plugins' CHECK "
            f"{fwd['plugins_check_median_ms']:.2f} ms (medians; nri-cni's verify --check over verify of the pod)"
            + floor_why
            + spread(fwd["run_median_ratio_interval"]),
        ),
        Row(
            "CRI-O: stop+remove, shim vs CRI-O's own CNI (medians)",
            f"{shim['stop_remove']['median']:.1f} ms",
            f"CRI-O {own['stop_remove']['median']:.1f} ms",
            f"{c1['stop_remove_median_ratio']:.3f}",
            "crio_stop_remove",
            goals.met("crio_stop_remove", c1["stop_remove_median_ratio"]),
            why=bench_crio.describe_split(p1["stop_remove_split"])
            + floor_why
            + spread(c1["stop_remove_median_ratio_interval"]),
        ),
        Row(
            "CRI-O: the floor of a shim set-up, CRI-O's own CNI with the compiled shim chained after portmap "
            "(answered at once by bench/null_plugin.py, which also hears the NRI pod events, doing nothing) "
            "vs CRI-O's own CNI (medians: creation; stop+remove)",
            f"{floor['floor_run_median_ms']:.1f} ms; {floor['floor_stop_remove_median_ms']:.1f} ms",
            f"CRI-O {own['run']['median']:.1f} ms; {own['stop_remove']['median']:.1f} ms",
            f"{floor['floor_vs_own']['run']:.3f}; {floor['floor_vs_own']['stop_remove']:.3f}",
            "crio_floor",
            goals.met("crio_floor", floor["floor_vs_own"]["stop_remove"]),
            why=f"creation's {describe_interval(floor['floor_vs_own_interval']['run'])}, stop+remove's "
            f"{describe_interval(floor['floor_vs_own_interval']['stop_remove'])}; nri-cni's shim over this floor: "
            f"creation (the same work) {with_interval(fwd['over_floor'], fwd['over_floor_interval'])}, "
            f"stop+remove {bounded(floor, 'shim_vs_floor', 'stop_remove')}",
        ),
        Row(
            "CRI-O: secondary mode, cost of one extra network (RunPodSandbox over CRI-O with eth0 only)",
            f"{c2['run_median_diff_ms']:+.1f} ms",
            f"CRI-O {p2['modes']['crio-base']['run']['median']:.1f} ms (no 2nd network of its own)",
            f"{c2['run_median_ratio']:.3f} of eth0 only",
            "-",
            goals.NO_GOAL,
            why=f"nri-cni's ADD {sec_add.get('median_ms', 0):.1f} ms; stop+remove "
            f"{c2['stop_remove_median_diff_ms']:+.1f} ms",
        ),
    ]


def run_daemon(size: dict) -> list[Row]:
    from bench import bench_daemon

    rep = bench_daemon.measure(Namespace(parallel=8, chain="noop", **size))
    m, r = rep["memory"], rep["restart"]
    flat = abs(m["growth"]) <= 0.10
    rows = []
    c = r.get("rounds")
    if c:
        mean, med = statistics.mean(c["seconds"]), statistics.median(c["seconds"])
        netlink = statistics.median(c["netlink_s"])
        checked = statistics.mean(c["checked_s"])
        rows.append(
            Row(
                f"the daemon's verify round over {r['pods']} real dual-stack pods (bridge + host-local + "
                f"portmap), CHECK cadence on ({len(c['seconds'])} rounds: 1 in 10 attachments CHECKed a round, "
                "after the round)",
                f"mean {mean * 1e3:.0f} ms (median {med * 1e3:.0f}, max {max(c['seconds']) * 1e3:.0f}); "
                f"its CHECKs done at mean {checked * 1e3:.0f} ms",
                f"netlink + host side {netlink * 1e3:.0f} ms",
                f"{min(c['checks'])}-{max(c['checks'])} CHECKs a round",
                "verify_cadence",
                goals.met("verify_cadence", mean),
                why=f"netlink and the host side {netlink * 1e3:.0f} ms for every pod; the round's CNI CHECKs "
                f"of ~{statistics.mean(c['checks']):.0f} attachments (3 Go plugin processes each, a couple "
                f"per CPU at once, nice 10) follow it, done at mean {checked * 1e3:.0f} ms from its start",
            )
        )
    return rows + [
        Row(
            f"daemon restart with {r['pods']} dual-stack pods attached, until ready and verified ({r['verified']}"
            + (f"; the round's CHECKs done at {r['checked_s']:.2f} s" if r.get("checked_s") else "")
            + ")",
            f"ready {r['ready_s']:.2f} s, "
            + (
                f"verified {r['verified_s']:.2f} s"
                if r["verified_s"] is not None
                else "verified: not measured"
            )
            + f" (settled {r['settled_s']:.2f} s)",
            "-",
            "-",
            "restart",
            goals.met("restart", r["verified_s"]) + ("" if r["verified_s"] is not None else ": no verify"),
        ),
        Row(
            f"resident memory over a {m['pods']}-pod churn, {m['parallel']} at a time",
            f"{m['first_idle_kib'] / 1024:.1f} -> {m['end_idle_kib'] / 1024:.1f} MiB "
            f"({m['growth']:+.1%}), max {m['max_kib'] / 1024:.1f}",
            "-",
            "-",
            "memory",
            goals.met("memory", m["max_kib"] / 1024) if flat else goals.NO,
        ),
    ]


def run_verify(size: dict) -> list[Row]:
    from bench import bench_verify, verify_service

    made: list = []
    try:
        bench_verify.make_pods(size["pods"], made)
        net = bench_verify.measure(made, size["rounds"], fork_sample=10, workers=None)
        svc = verify_service.measure(made, size["rounds"])
        # with what a pod needs besides its interface: a route, a hostPort's DNAT rules, a lease
        host = verify_service.measure(made, size["rounds"], host_side=True)
        seen = bench_verify.damage_is_seen(made)  # intact pods ok, flushed ones broken: or no figure
    finally:
        bench_verify.remove_pods(made)
    not_ok = (
        {k: v["not_ok"] for k, v in net["methods"].items() if v["not_ok"]}
        | ({"service": svc["not_ok"]} if svc["not_ok"] else {})
        | ({"service-host-side": host["not_ok"]} if host["not_ok"] else {})
    )
    if not_ok or not seen:
        raise RuntimeError(f"verify bench judged wrongly: intact pods not ok {not_ok}, damage seen: {seen}")
    one = net["methods"]["serial-iproute"]["median_s"]
    t = svc["median_s"]
    return [
        Row(
            f"verify of {net['pods']} dual-stack pods (PodService.verify: netlink round and verdicts)",
            f"{t * 1e3:.0f} ms",
            f"a pyroute2 IPRoute per pod {one * 1e3:.0f} ms",
            f"{one / t:.1f}x as fast",
            "verify",
            goals.met("verify", t),
        ),
        Row(
            f"verify of {net['pods']} dual-stack pods with their routes, a hostPort's DNAT rules "
            "(iptables and ip6tables) and leases (host-local) each",
            f"{host['median_s'] * 1e3:.0f} ms",
            f"the same without them {t * 1e3:.0f} ms",
            f"{host['median_s'] / t:.2f}x the time",
            "verify_host",
            goals.met("verify_host", host["median_s"]),
        ),
    ]


def run_attach(size: dict) -> list[Row]:
    from bench import bench_attach

    rep = bench_attach.measure(Namespace(pods=size["pods"], warmup=size["warmup"]))
    ctd = bench_attach.measure_containerd(Namespace(pods=size["containerd_pods"], warmup=size["warmup"]))
    r = rep["at_once_over_bound"]
    modes, cmp = ctd["modes"], ctd["compare"]
    add = modes["shim3"].get("nri_cni_ops", {}).get("add", {})
    shim_ms, ctd_ms = modes["shim3"]["run"]["median"], modes["containerd3"]["run"]["median"]
    floor = ctd["floor"]
    return [
        Row(
            "pod with 3 networks (bridge + host-local each), RunPodSandbox: shim vs containerd (max_conf_num = 3)",
            f"{shim_ms:.1f} ms",
            f"containerd {ctd_ms:.1f} ms",
            f"{cmp['run_median_ratio']:.3f} (per-pod {cmp['run_per_pod_ratio_median']:.3f})",
            "attach3",
            goals.met("attach3", cmp["run_median_ratio"]),
            why=f"nri-cni's ADD of the three networks at once {add.get('median_ms', float('nan')):.1f} ms; the "
            "rest is the compiled shim's exec and socket round trip and the NRI events, where containerd "
            f"calls go-cni in its own process; a shim set-up doing nothing (containerd's own three networks, "
            f"the shim chained after eth0's bridge and answered at once, the NRI events heard) is "
            f"{bounded(floor, 'floor_vs_own', 'run')} of containerd's own, nri-cni's shim "
            f"{bounded(floor, 'shim_vs_floor', 'run')} of that floor"
            + spread(cmp["run_median_ratio_interval"]),
        ),
        Row(
            "pod ADD of 3 networks (bridge + host-local each) at once vs the larger of its slowest "
            "chain alone and its plugins' CPU time / CPUs",
            f"{rep['at_once_median_ms']:.1f} ms",
            f"slowest alone {rep['slowest_alone_median_ms']:.1f} ms, plugins' CPU "
            f"{rep['plugins_cpu_median_ms']:.1f} ms / {rep['cpus']} CPUs {rep['cpu_bound_median_ms']:.1f} ms",
            f"{r:.2f} (slowest alone {rep['at_once_over_slowest']:.2f})",
            "attach_at_once",
            goals.met("attach_at_once", r),
            why=f"the CPU bound the larger in {rep['cpu_bound_rules']} of {rep['pods']} rounds; one after "
            f"another {rep['one_by_one_median_ms']:.1f} ms (at once / one after another "
            f"{rep['at_once_over_one_by_one']:.2f}): the bridge chains overlap (the op record's `at`), "
            "but each one's ADD grows when they do: netlink changes of every netns take the kernel's "
            "one rtnl lock",
        ),
    ]


def run_ttrpc(size: dict) -> list[Row]:
    from bench import bench_ttrpc

    rep = bench_ttrpc.measure(size["n"])
    return [
        Row(
            "NRI request, bare round trip (RunPodSandbox through the stub vs a socket echo)",
            f"{rep['rpc_us']:.1f} us",
            f"echo {rep['echo_us']:.1f} us",
            f"+{rep['added_us']:.1f} us",
            "ttrpc",
            goals.met("ttrpc", rep["added_us"]),
            why=f"measured apart, without a socket: the stub's side {rep['stub_us']:.1f} us (mux, ttrpc, "
            f"protobuf, the handler's task), the runtime double's {rep['runtime_us']:.1f} us (Python here, "
            f"Go in a runtime); the rest {rep['added_us'] - rep['stub_us'] - rep['runtime_us']:.1f} us is "
            "the call's second socket read and loop turns on each side",
        )
    ]


def run_containers(size: dict) -> list[Row]:
    from bench import bench_containers

    rep = bench_containers.measure(Namespace(adjusted="all", **size))
    adj, plain = rep["adjusted"], rep["plain"]
    return [
        Row(
            f"CreateContainer + StartContainer, {size['containers']} busybox containers per side "
            f"(+{size['warmup']} warm-up) in {size['pods']} pods, alternated: adjusted vs plain",
            f"median {adj['median']:.1f} ms, p90 {adj['p90']:.1f}",
            f"plain median {plain['median']:.1f} ms, p90 {plain['p90']:.1f}",
            f"{rep['ratio']:.3f} (per-round {rep['per_round_ratio_median']:.3f})",
            "containers",
            goals.met("containers", rep["ratio"]),
            why=bench_containers.describe_split(rep["split"]),
        )
    ]


RUNNERS = {
    "cni": run_cni,
    "gc": run_gc,
    "pods": run_pods,
    "crio": run_crio,
    "daemon": run_daemon,
    "verify": run_verify,
    "attach": run_attach,
    "ttrpc": run_ttrpc,
    "containers": run_containers,
}


# -- output ------------------------------------------------------------------------------------

HEAD = ("figure", "nri-cni", "anchor", "ratio", "goal", "met", "load")


def _cells(row: Row) -> tuple[str, ...]:
    return (row.figure, row.nri, row.anchor, row.ratio, row.goal, row.met, row.load)


def text_table(rows: list[Row]) -> str:
    cells = [HEAD] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(HEAD))).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(out)


def machine() -> str:
    cpus = os.cpu_count()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpus} CPU ({model}){mem}, Linux {platform.release()}, Python {platform.python_version()}"


def deps_versions() -> str:
    deps = Path(os.environ.get("NRI_CNI_DEPS", "/opt/nri-cni-deps")) / "versions.txt"
    try:
        return ", ".join(deps.read_text().split("\n")[:-1])
    except OSError:
        return "?"


def uptime() -> str:
    """`uptime`'s line: the machine's load, as the docs quote it next to every figure."""
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def command_line(args: Namespace) -> str:
    """The command that made this table, as the docs quote it."""
    return " ".join(
        ["python -m bench"]
        + (["--smoke"] if args.smoke else ["--full"] if args.full else [])
        + ([f"--only {args.only}"] if args.only != ",".join(BENCHES) else [])
        + (["--strict"] if args.strict else [])
        + (["--write-doc"] if args.write_doc else [])
    )


def published(header: str, rows: list[Row], notes: str, before: str, after: str) -> str:
    """docs/performance.md's table section: one run's output, its command, date and load."""
    return (
        goals.TABLE_BEGIN
        + "\n\n"
        + f"`uptime` before: `{before}`; after: `{after}`\n\n"
        + header.replace("\n", "  \n")
        + "\n\n"
        + markdown_table(rows)
        + "\n\n<!-- goal keys: "
        + ", ".join(r.key for r in rows)
        + " -->"
        + notes.replace(":\n-", ":\n\n-")
        + "\n\n"
        + goals.TABLE_END
    )


def write_goals() -> None:
    for doc in goals.DOCS:
        path = REPO / doc
        path.write_text(goals.with_goals(path.read_text()))
        print(f"bench: goal table written in {doc}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes: does every bench still work (CI)")
    size.add_argument("--full", action="store_true", help="the sizes of docs/performance.md")
    ap.add_argument("--only", default=",".join(BENCHES), help="subset of " + ",".join(BENCHES))
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed or not measured, too")
    ap.add_argument("--markdown", metavar="FILE", help="write the table as markdown here too")
    ap.add_argument("--json", metavar="FILE", help="write the rows here too")
    ap.add_argument(
        "--write-doc",
        action="store_true",
        help="write the table into docs/performance.md (its table section)",
    )
    ap.add_argument(
        "--write-goals",
        action="store_true",
        help="only write bench/goals.py's table into bench/README.md and docs/performance.md",
    )
    args = ap.parse_args(argv)
    if args.write_goals:
        write_goals()
        return 0
    if os.geteuid() != 0:
        print("bench: needs root (netns, containerd, iptables)", file=sys.stderr)
        return 2
    doc = REPO / "docs" / "performance.md"
    if args.write_doc and goals.TABLE_BEGIN not in doc.read_text():
        ap.error(f"--write-doc: {doc} has no table section ({goals.TABLE_BEGIN})")
    which = "smoke" if args.smoke else "full" if args.full else "short"
    only = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(only) - set(BENCHES)
    if unknown:
        ap.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    rows: list[Row] = []
    failed: list[str] = []
    up_before = uptime()
    t_start = time.monotonic()
    for name in BENCHES:
        if name not in only:
            continue
        print(f"\n=== bench {name} ({which}) ===", flush=True)
        before = _load()
        t0 = time.monotonic()
        try:
            with machine_turn(f"bench {name}"):  # no test or bench of another run beside it
                got = RUNNERS[name](SIZES[which][name])
        except BaseException as exc:  # every bench runs; the failure is loud in the table and the exit status
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()
            failed.append(name)
            got = [Row(f"bench {name}", "-", f"{type(exc).__name__}: {exc}"[:120], "-", "-", goals.FAILED)]
        load = f"{before}/{_load()}"
        for r in got:
            r.load = r.load or load
        rows += got
        print(f"=== bench {name}: {time.monotonic() - t0:.0f} s", flush=True)
    header = (
        f"{command_line(args)}: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.monotonic() - t_start:.0f} s\n"
        f"machine: {machine()}\ndeps: {deps_versions()}\n"
        f"load: 1-minute load average before/after each bench"
    )
    whys = [f"- {r.figure}: {r.why}" for r in rows if r.met in (goals.NO, goals.FAILED) and r.why]
    notes = "\n\nwhy the rows marked NO miss (each bench's own profile):\n" + "\n".join(whys) if whys else ""
    print("\n" + header + "\n\n" + text_table(rows) + notes)
    if args.markdown:
        Path(args.markdown).write_text(
            header.replace("\n", "  \n")
            + "\n\n"
            + markdown_table(rows)
            + notes.replace(":\n-", ":\n\n-")
            + "\n"
        )
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ | {"goal": r.goal} for r in rows], indent=1))
    if args.write_doc:
        text = doc.read_text()
        head, _, rest = text.partition(goals.TABLE_BEGIN)
        doc.write_text(
            head + published(header, rows, notes, up_before, uptime()) + rest.partition(goals.TABLE_END)[2]
        )
        print("bench: table written in docs/performance.md")
    if failed:
        print(f"\nbench: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    missed = goals.strict_failures((r.figure, r.met) for r in rows)
    if args.strict and missed:
        print("\nbench --strict: missed or not measured:\n  " + "\n  ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
