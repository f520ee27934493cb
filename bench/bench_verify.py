#!/usr/bin/env python3
"""Verify N attached pods by netlink: nri-cni's inspector against serial baselines, in one run.

The bench makes N cheap "pods" (N=500 by default): each a netns of its own with one veth, `eth0`
inside with an IPv4 and an IPv6 address (dual-stack, the IPv6 one settled as the bridge plugin
leaves it: no duplicate address detection pending) and a route of each family through eth0, the
host end up on the host (no bridge, no traffic), all names unique (`nct...`). Each pod's
expectation names its netns, eth0, both addresses, its MAC and its host veth, as
`expectation_from_result` builds them from a bridge plugin's result.

Then, alternating round by round so that drift of the machine hits all alike:

  pool           nri_cni.node.NodeInspector as the daemon runs it (awaited in an event loop,
                 the default worker count): each worker enters a netns only to open one
                 netlink socket, reads links and addresses through it, compares
  pool-1         the same inspector with one worker (serial, one socket per pod)
  serial-iproute the obvious serial code: per pod, enter the netns on this thread, open
                 pyroute2's IPRoute there, get_links + get_addr, compare, close
  serial-fork    pyroute2's own way into a netns, IPRoute(netns=...), which forks a helper
                 per socket (a sample of --fork-sample pods, scaled to N: it is slow). It runs
                 in a single-threaded child process of its own: forked from a process with
                 threads, pyroute2's helper can deadlock on a lock another thread held at the
                 fork (seen here: the reason the inspector forks nothing)

  service        the daemon's own round, ServiceTimers.verify over the same pods with their cache
                 entries and the runtime's pod list (bench/verify_service.py): records read,
                 expectations built, netlink, verdicts written

Output: per method the median round time over --rounds rounds (after one warm-up round), the
per-pod cost, and the ratio of each baseline to `pool`. Goal `verify` (bench/goals.py): `pool` for 500 pods.
Then the addresses of 5 pods are flushed and one more round must find exactly those 5.

Everything made is removed at the end, also on failure, Ctrl-C or SIGTERM. Needs root.
Run:  sudo .venv/bin/python bench/bench_verify.py [--pods 500] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ipaddress
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import verify_service  # noqa: E402
from bench.native_node import free_subnet6  # noqa: E402
from nri_cni.cli.gctune import tune_gc  # noqa: E402
from nri_cni.node import Expectation, NodeInspector  # noqa: E402
from nri_cni.node.model import AddressState, HostLink, LinkState, NetnsView, compare  # noqa: E402
from tests.support.names import free_subnet  # noqa: E402  (a subnet nothing on the host uses)

NETNS_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class FakePod:
    netns: str  # name under /var/run/netns
    host_veth: str
    address: ipaddress.IPv4Interface
    mac: str
    route: str = ""  # a destination routed through eth0 (the host-side service round's result lists it)
    address6: ipaddress.IPv6Interface | None = None
    route6: str = ""  # the same for IPv6

    @property
    def addresses(self) -> tuple[ipaddress.IPv4Interface | ipaddress.IPv6Interface, ...]:
        return (self.address,) + ((self.address6,) if self.address6 else ())

    @property
    def path(self) -> str:
        return os.path.join(NETNS_DIR, self.netns)

    def expectation(self) -> Expectation:
        return Expectation(
            key=self.netns,
            netns=self.path,
            ifname="eth0",
            addresses=self.addresses,
            mac=self.mac,
            host_ifnames=(self.host_veth,),
        )


# ---- making and removing the pods -----------------------------------------------------------


def _ip_batch(lines: list[str], *, netns: str | None = None, force: bool = False) -> None:
    argv = ["ip"] + (["-n", netns] if netns else []) + (["-force"] if force else []) + ["-batch", "-"]
    p = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and not force:
        raise RuntimeError(f"{' '.join(argv)} failed: {p.stderr.strip()[:500]}")


def make_pods(n: int, made: list[FakePod]) -> None:
    """Appends to `made` before creating, so that cleanup knows every name it may have to remove."""
    tag = "".join(random.choice("0123456789abcdef") for _ in range(5))
    subnet = free_subnet(max(8, 32 - (n + 2).bit_length()))
    routed = str(free_subnet(24, exclude=[str(subnet)]))
    subnet6, routed6 = free_subnet6(), str(free_subnet6())
    hosts, hosts6 = subnet.hosts(), subnet6.hosts()
    next(hosts6)  # ::1, the gateway's on a bridge
    for i in range(n):
        name = f"nctvb{tag}{i:05d}"
        mac = "0a:58:%02x:%02x:%02x:%02x" % (random.randrange(256), i >> 16, (i >> 8) & 255, i & 255)
        address = ipaddress.ip_interface(f"{next(hosts)}/{subnet.prefixlen}")
        address6 = ipaddress.IPv6Interface(f"{next(hosts6)}/64")
        made.append(FakePod(name, name, address, mac, routed, address6, routed6))
    lines = []
    for pod in made:
        lines += [
            f"netns add {pod.netns}",
            f"link add {pod.host_veth} type veth peer name eth0 address {pod.mac} netns {pod.netns}",
            f"link set {pod.host_veth} up",
        ]
    _ip_batch(lines)
    # inside each netns: lo and eth0 up, the address (one `ip` per netns, a few at a time)
    procs: list[subprocess.Popen] = []
    for pod in made:
        p = subprocess.Popen(["ip", "-n", pod.netns, "-batch", "-"], stdin=subprocess.PIPE, text=True)
        assert p.stdin is not None
        p.stdin.write(
            f"link set lo up\nlink set eth0 up\naddr add {pod.address} dev eth0\nroute add {pod.route} dev eth0\n"
            f"addr add {pod.address6} dev eth0 nodad\nroute add {pod.route6} dev eth0\n"
        )
        p.stdin.close()
        procs.append(p)
        if len(procs) >= 16:
            _wait_all(procs)
    _wait_all(procs)


def _wait_all(procs: list[subprocess.Popen]) -> None:
    while procs:
        p = procs.pop()
        if p.wait(timeout=60) != 0:
            raise RuntimeError(f"{p.args} failed")


def remove_pods(made: list[FakePod]) -> None:
    """Deleting a veth's host end takes its peer; the netns go after. Names that are already
    gone (a creation cut short) are fine: -force goes on past errors."""
    if not made:
        return
    _ip_batch([f"link del {p.host_veth}" for p in made], force=True)
    _ip_batch([f"netns del {p.netns}" for p in made], force=True)
    left = [p.netns for p in made if os.path.exists(p.path)]
    if left:
        print(f"WARNING: {len(left)} netns could not be removed, e.g. {left[:3]}", file=sys.stderr)


# ---- the methods -------------------------------------------------------------------------------


async def pool_round(inspector: NodeInspector, exps: list[Expectation]) -> int:
    findings = await inspector.inspect(exps)
    return sum(not f.ok for f in findings)


def serial_iproute_round(exps: list[Expectation]) -> int:
    """The obvious code: per pod, this thread enters the netns, pyroute2's IPRoute opens there."""
    from pyroute2 import IPRoute

    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    with IPRoute() as ipr:
        host_links = _host_links(ipr)
    bad = 0
    try:
        for exp in exps:
            fd = os.open(exp.netns, os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
                try:
                    ipr = IPRoute()
                finally:
                    if _libc.setns(home, CLONE_NEWNET) != 0:
                        raise SystemExit("cannot return to the host netns")
            finally:
                os.close(fd)
            with ipr:
                bad += not compare(exp, _view(ipr, exp.netns), host_links).ok
    finally:
        os.close(home)
    return bad


def serial_fork_round(exps: list[Expectation]) -> int:
    """pyroute2's netns= argument: a forked child opens each socket."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        host_links = _host_links(ipr)
    bad = 0
    for exp in exps:
        with IPRoute(netns=os.path.basename(exp.netns)) as ipr:
            bad += not compare(exp, _view(ipr, exp.netns), host_links).ok
    return bad


def fork_round_in_child(pods: list[FakePod]) -> tuple[float, int]:
    """serial_fork_round in a fresh single-threaded interpreter: (seconds, pods not ok)."""
    spec = json.dumps([[p.netns, str(p.address), p.mac, p.host_veth, str(p.address6)] for p in pods])
    out = subprocess.run(
        [sys.executable, __file__, "--fork-round"], input=spec, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"serial-fork child failed: {out.stderr.strip()[-500:]}")
    seconds, bad = json.loads(out.stdout)
    return seconds, bad


def _fork_round_child() -> int:
    pods = [
        FakePod(n, h, ipaddress.IPv4Interface(a), m, address6=ipaddress.IPv6Interface(a6))
        for n, a, m, h, a6 in json.load(sys.stdin)
    ]
    exps = [p.expectation() for p in pods]
    serial_fork_round(exps[:1])  # warm: pyroute2's import
    t0 = time.perf_counter()
    bad = serial_fork_round(exps)
    print(json.dumps([time.perf_counter() - t0, bad]))
    return 0


def _host_links(ipr) -> dict[str, HostLink]:
    out = {}
    for m in ipr.get_links():
        info = m.get_attr("IFLA_LINKINFO")
        kind = (info.get_attr("IFLA_INFO_KIND") if info is not None else None) or ""
        name = m.get_attr("IFLA_IFNAME")
        out[name] = HostLink(name, m["index"], kind, m.get_attr("IFLA_MASTER"))
    return out


def _view(ipr, netns: str) -> NetnsView:
    view = NetnsView(netns=netns)
    for m in ipr.get_links():
        name = m.get_attr("IFLA_IFNAME")
        view.links[name] = LinkState(
            m["index"],
            name,
            (m.get_attr("IFLA_ADDRESS") or "").lower(),
            bool(m["flags"] & 1),
            bool(m["flags"] & 0x10000),
        )
    for a in ipr.get_addr():
        flags = a.get_attr("IFA_FLAGS")
        flags = a["flags"] if flags is None else flags
        view.addresses.setdefault(a["index"], []).append(
            AddressState(
                ipaddress.ip_interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"),
                a["scope"],
                bool(flags & 0x80),
            )
        )
    return view


# ---- the run -----------------------------------------------------------------------------------


def measure(pods: list[FakePod], rounds: int, fork_sample: int, workers: int | None) -> dict:
    exps = [p.expectation() for p in pods]
    sample = pods[: max(1, min(fork_sample, len(pods)))]
    inspector = NodeInspector.with_workers(*([workers] if workers else []))
    serial = NodeInspector.with_workers(1)
    times: dict[str, list[float]] = {"pool": [], "pool-1": [], "serial-iproute": [], "serial-fork": []}
    damaged: dict[str, int] = {}

    async def run_all() -> None:
        loop = asyncio.get_running_loop()
        methods = {
            "pool": lambda: pool_round(inspector, exps),
            "pool-1": lambda: pool_round(serial, exps),
            "serial-iproute": lambda: loop.run_in_executor(None, serial_iproute_round, exps),
        }
        for r in range(rounds + 1):  # round 0 warms up (pyroute2's import, the pools' threads)
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for name in order:
                t0 = time.perf_counter()
                bad = await methods[name]()
                dt = time.perf_counter() - t0
                if r:
                    times[name].append(dt)
                damaged[name] = max(damaged.get(name, 0), bad)
            if r:
                dt, bad = await loop.run_in_executor(None, fork_round_in_child, sample)
                times["serial-fork"].append(dt * len(exps) / len(sample))
                damaged["serial-fork"] = max(damaged.get("serial-fork", 0), bad)

    try:
        asyncio.run(run_all())
    finally:
        inspector.close()
        serial.close()
    n = len(exps)
    pool_med = statistics.median(times["pool"])
    out = {"pods": n, "rounds": rounds, "fork_sample": len(sample), "methods": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        out["methods"][name] = {
            "median_s": med,
            "min_s": min(ts),
            "max_s": max(ts),
            "per_pod_us": med / n * 1e6,
            "ratio_to_pool": med / pool_med,
            "not_ok": damaged[name],
        }
    return out


def damage_is_seen(pods: list[FakePod]) -> bool:
    """The timed rounds saw only intact pods; a few flushed addresses must show, or the bench
    measured something that looks at nothing."""
    damaged = pods[:: max(1, len(pods) // 5)][:5]
    for pod in damaged:
        _ip_batch(["addr flush dev eth0"], netns=pod.netns)
    inspector = NodeInspector.with_workers()
    try:
        findings = inspector.inspect_blocking([p.expectation() for p in pods])
    finally:
        inspector.close()
    found = {f.expectation.key for f in findings if not f.ok}
    want = {p.netns for p in damaged}
    print(f"damage check: {len(found & want)} of {len(want)} flushed pods found, {len(found - want)} others")
    broken = verify_service.broken_after_damage(pods)
    print(f"service: {len(broken & want)} of {len(want)} flushed pods broken, {len(broken - want)} others")
    return found == want and broken == want


def report(res: dict) -> None:
    print(
        f"\nverify {res['pods']} pods by netlink, median of {res['rounds']} rounds (serial-fork: "
        f"{res['fork_sample']} pods per round, scaled)"
    )
    print(
        f"{'method':<16}{'round ms':>10}{'min ms':>9}{'max ms':>9}{'per pod us':>12}{'x pool':>8}{'not ok':>8}"
    )
    for name, m in res["methods"].items():
        print(
            f"{name:<16}{m['median_s'] * 1e3:>10.1f}{m['min_s'] * 1e3:>9.1f}{m['max_s'] * 1e3:>9.1f}"
            f"{m['per_pod_us']:>12.0f}{m['ratio_to_pool']:>8.2f}{m['not_ok']:>8}"
        )
    pool = res["methods"]["pool"]
    verdict = "met" if pool["median_s"] < 1.0 else "NOT met"
    print(f"\ngoal: {res['pods']} pods in < 1 s -> {pool['median_s'] * 1e3:.0f} ms ({verdict})")
    svc = res["methods"]["service"]
    verdict = "met" if svc["median_s"] < 1.0 else "NOT met"
    print(
        f"goal: PodService.verify of {res['pods']} pods in < 1 s -> {svc['median_s'] * 1e3:.0f} ms ({verdict})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fork-sample", type=int, default=50, help="pods per round for serial-fork")
    ap.add_argument("--workers", type=int, default=0, help="pool size (default: the inspector's)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--fork-round", action="store_true", help=argparse.SUPPRESS)  # the serial-fork child
    args = ap.parse_args()
    if args.fork_round:
        return _fork_round_child()
    if os.geteuid() != 0:
        print("needs root (netns, veths)", file=sys.stderr)
        return 2
    tune_gc()
    # SIGTERM (and SIGHUP) end the run like Ctrl-C, through the cleanup below
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    made: list[FakePod] = []
    try:
        t0 = time.perf_counter()
        make_pods(args.pods, made)
        print(f"made {len(made)} pods in {time.perf_counter() - t0:.1f} s")
        res = measure(made, args.rounds, args.fork_sample, args.workers or None)
        svc = verify_service.measure(made, args.rounds)
        res["methods"]["service"] = {
            **svc,
            "ratio_to_pool": svc["median_s"] / res["methods"]["pool"]["median_s"],
        }
        bad = {k: v["not_ok"] for k, v in res["methods"].items() if v["not_ok"]}
        if bad:
            print(f"ERROR: intact pods reported as damaged: {bad}", file=sys.stderr)
            return 1
        report(res)
        if not damage_is_seen(made):
            return 1
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
        return 0
    except KeyboardInterrupt:
        print("interrupted: cleaning up", file=sys.stderr)
        return 130
    finally:
        # no second Ctrl-C in the middle of the cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        t0 = time.perf_counter()
        remove_pods(made)
        print(f"removed {len(made)} pods in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
