#!/usr/bin/env python3
"""Pod latency through real containerd 2.1.9: nri-cni's modes against containerd's own CNI.

Two parts, each with containerd instances side by side (private dirs, started once), driven
over CRI one pod at a time and ALTERNATED pod by pod (the order rotates every pod), so that the
drift of a shared, noisy machine hits every mode alike:

  shim       nri-cni-shim is containerd's only CNI network; the nri-cni daemon runs the pod's
             bridge + host-local + portmap list and answers the shim.
     vs
  native     containerd runs the same bridge + host-local + portmap list itself (no NRI plugin).
     and
  floor      containerd runs that list itself with the compiled shim chained after portmap,
             pointed at bench/null_plugin.py, which answers the shim at once and hears the pod's
             NRI events as nri-cni does, doing nothing: what any shim set-up costs whatever its
             daemon does (the shim's exec, stdin, socket round trip and exit, the NRI round trips).

  secondary  containerd runs the bridge list (eth0); nri-cni (mode: secondary) adds a macvlan +
             host-local network (net1) in NRI RunPodSandbox and DELs it in NRI StopPodSandbox.
     vs
  native2    containerd runs both lists itself (max_conf_num = 2: eth0 and eth1), no NRI plugin.
             containerd's go-cni ADDs the two lists AT ONCE (one goroutine each): eth1 overlaps eth0.
  native2s   the same with the CRI option cni.setup_serially = true: eth1 after eth0, as an NRI
             plugin's network must come (RunPodSandbox reaches NRI after the runtime's own CNI).
     and
  base       containerd with the bridge list only: what the extra network costs in each.

Measured per pod: RunPodSandbox, then StopPodSandbox + RemovePodSandbox (gRPC round trips as
kubelet sees them). Every pod is checked after its RunPodSandbox (outside the timing): its CRI
IP is in the right subnet and the extra interface exists, so a mode that silently skipped its
work (an NRI call past its timeout) cannot look fast. No FINALIZE drop-ins are installed: the
plain network work is compared. Pods have no port mappings unless --host-ports is given (then
one per pod, bound to the bridge's gateway address, like bench_cni.py).

Output: per mode medians and p90 (ms); part 1 the median ratio shim/native and the median of the
per-pod ratios, floor/native and shim/floor; part 2 the medians and the difference secondary - native2.

Everything the bench makes (containerd instances and their pods, nri-cni daemons, bridges,
veths, iptables rules, host-local reservations, libcni cache entries, temp dirs) is removed at
the end, also on failure, Ctrl-C or SIGTERM. Subnets 10.246.160.0/24 .. 10.246.168.0/24 and
10.246.177.0/24.
Needs root and the parts from .ci/install-deps.
Run:  sudo ./.venv/bin/python bench/bench_pods.py [--pods 40] [--part 1|2|all]
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.containerd import CRI_RT, Containerd, cni_plugin_dir  # noqa: E402
from tests.support.hostlocal import host_local_reservations  # noqa: E402
from tests.support.hostnet import BridgeNetwork, cni_cache_files  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402
from tests.support.names import unique_name  # noqa: E402
from tests.support.nricni import NriCni, ShimSetup  # noqa: E402
from tests.support.pause.image import build_pause_image  # noqa: E402

NAMESPACE = "nct-bench"
SUBNETS = {
    "native": "10.246.160.0/24",
    "shim": "10.246.161.0/24",
    "native2": "10.246.162.0/24",
    "native2-extra": "10.246.163.0/24",
    "secondary": "10.246.164.0/24",
    "secondary-extra": "10.246.165.0/24",
    "base": "10.246.166.0/24",
    "native2s": "10.246.167.0/24",
    "native2s-extra": "10.246.168.0/24",
    "floor": "10.246.177.0/24",
}
HOST_PORT_BASE = {
    "native": 21000,
    "shim": 22000,
    "native2": 23000,
    "secondary": 24000,
    "base": 25000,
    "native2s": 26000,
    "floor": 27000,
}


class Interrupted(Exception):
    pass


def _on_sigterm(signum, frame):
    raise Interrupted(f"signal {signum}")


@dataclass
class Mode:
    """One containerd instance and what a pod of it must have."""

    name: str
    ctd: Containerd
    net: BridgeNetwork  # the pod's eth0 network
    extra_if: str = ""  # the interface the extra network must have made ("" = none)
    run_ms: list[float] = field(default_factory=list)
    stop_ms: list[float] = field(default_factory=list)
    remove_ms: list[float] = field(default_factory=list)
    ipam_dirs: list[Path] = field(default_factory=list)
    daemon: NriCni | None = None  # the nri-cni daemon of this instance, if any
    measured_pods: set[str] = field(default_factory=set)
    run_order: list[str] = field(default_factory=list)  # the measured pods, as run_ms has them

    def check(self, pod: str) -> None:
        st = self.ctd.cri.pod_status(pod)
        if not st.ready or ipaddress.ip_address(st.ip) not in self.net.network:
            raise RuntimeError(
                f"{self.name}: pod {pod[:12]} is {st.state} with IP {st.ip!r}, not in {self.net.subnet}"
            )
        if self.extra_if:
            out = subprocess.run(
                ["nsenter", f"--net={st.netns_path}", "ip", "-o", "-4", "addr", "show", "dev", self.extra_if],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0 or " inet " not in out.stdout:
                raise RuntimeError(
                    f"{self.name}: pod {pod[:12]} has no {self.extra_if} with an "
                    f"address: {out.stderr.strip() or out.stdout.strip()}"
                )


def _pct(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


RATIO_ROUNDS = 2000  # resamples of the bootstrap interval of a median ratio


def ratio_interval(a: list[float], b: list[float], *, rounds: int = RATIO_ROUNDS) -> tuple[float, float]:
    """The 95 % bootstrap interval of median(a) / median(b): each side's pods resampled with
    replacement `rounds` times (a fixed seed: the same samples give the same interval), the
    2.5th and 97.5th percentiles of the resampled ratios. How far the one run's ratio can be
    trusted: a pod's time spreads far more than the goals' 3 % (CRI-O's stop: 24-64 ms)."""
    rng = random.Random(1)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(rounds)
    )
    return round(ratios[int(rounds * 0.025)], 3), round(ratios[int(rounds * 0.975) - 1], 3)


def describe_interval(interval: tuple[float, float]) -> str:
    return f"95 % interval {interval[0]:.3f}-{interval[1]:.3f}"


def with_interval(ratio: float, interval: tuple[float, float]) -> str:
    """A ratio and its 95 % interval, as the rows and the benches' lines print them."""
    return f"{ratio:.3f} ({describe_interval(interval)})"


def start_null(nri_socket: str, socket_path: str) -> subprocess.Popen:
    """bench/null_plugin.py, started; returns once it serves the shim and is registered. Its
    stderr goes to a file beside its socket (a pipe nobody reads could fill and stop it)."""
    log_path = Path(socket_path).with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "null_plugin.py"),
                "--nri-socket",
                nri_socket,
                "--socket",
                socket_path,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    line = proc.stdout.readline() if proc.stdout else ""  # its "ready", or "" when it ended
    if line.strip() != "ready":
        stop_null(proc)
        raise RuntimeError(f"the null plugin did not start: {log_path.read_text(errors='replace').strip()}")
    return proc


def chain_null_shim(net: BridgeNetwork, socket_path: str) -> None:
    """The compiled shim chained after the last plugin of `net`'s list, pointed at the null
    plugin's socket, in the list the runtime reads."""
    net.conflist["plugins"].append({"type": "nri-cni-shim", "daemonSocket": socket_path})
    for path in net.conf_dir.glob("*.conflist"):
        path.write_text(json.dumps(net.conflist, indent=2))


def stop_null(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.communicate()


def stop_nulls(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        stop_null(proc)


def floor_compare(modes: dict, *, own: str, shim: str, floor: str) -> dict:
    """The floor against the runtime's own CNI, and nri-cni's shim against the floor: the
    medians' ratios of RunPodSandbox and of stop+remove, each with its 95 % interval over the
    run's pods (`ratio_interval`: how far the one run tells a bound from a goal)."""

    def ratio(a: str, b: str, what: str) -> float:
        return round(modes[a][what]["median"] / modes[b][what]["median"], 3)

    def pods(name: str, what: str) -> list[float]:
        raw = modes[name]["raw"]
        return raw["run"] if what == "run" else [s + r for s, r in zip(raw["stop"], raw["remove"])]

    def interval(a: str, b: str) -> dict[str, tuple[float, float]]:
        return {what: ratio_interval(pods(a, what), pods(b, what)) for what in ("run", "stop_remove")}

    return {
        "floor_vs_own": {"run": ratio(floor, own, "run"), "stop_remove": ratio(floor, own, "stop_remove")},
        "shim_vs_floor": {"run": ratio(shim, floor, "run"), "stop_remove": ratio(shim, floor, "stop_remove")},
        "floor_vs_own_interval": interval(floor, own),
        "shim_vs_floor_interval": interval(shim, floor),
        "floor_run_median_ms": modes[floor]["run"]["median"],
        "floor_stop_remove_median_ms": modes[floor]["stop_remove"]["median"],
    }


def describe_floor(floor: dict, own: str) -> str:
    mine, over = floor["floor_vs_own"], floor["shim_vs_floor"]
    mine_in, over_in = floor["floor_vs_own_interval"], floor["shim_vs_floor_interval"]
    return (
        f"  the floor ({own} + a null shim chained + a null NRI plugin) / {own}: creation "
        f"{with_interval(mine['run'], mine_in['run'])}, stop+remove "
        f"{with_interval(mine['stop_remove'], mine_in['stop_remove'])}; nri-cni's shim / the floor: creation "
        f"{with_interval(over['run'], over_in['run'])}, stop+remove {with_interval(over['stop_remove'], over_in['stop_remove'])}"
    )


def _summary(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 2),
        "p90": round(_pct(values, 90), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def macvlan_list(name: str, master: str, subnet: str, ipam_dir: Path) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "macvlan",
                "master": master,
                "mode": "bridge",
                "ipam": {"type": "host-local", "dataDir": str(ipam_dir), "ranges": [[{"subnet": subnet}]]},
            }
        ],
    }


class Bench:
    def __init__(self, args, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.tmp = Path(tempfile.mkdtemp(prefix="nct-bench-pods-"))
        stack.callback(shutil.rmtree, self.tmp, True)
        self.pause = build_pause_image()
        self.problems: list[str] = []

    # -- parts that clean up after themselves (ExitStack: last made, first removed) ----------

    def bridge_net(self, mode: str) -> BridgeNetwork:
        d = self.tmp / f"net-{mode}"
        d.mkdir()
        net = BridgeNetwork(
            d, bridge=unique_name("bp"), subnet=SUBNETS[mode], name=f"nct-bench-{mode}-{secrets.token_hex(3)}"
        )
        self.stack.callback(lambda: self.problems.extend(net.cleanup()))
        return net

    def janitor(self) -> Janitor:
        jan = Janitor()
        self.stack.callback(lambda: self.problems.extend(jan.cleanup()))
        return jan

    def daemons(self) -> list[NriCni]:
        started: list[NriCni] = []
        # registered before any containerd: runs after their cleanup (pods gone, nri-cni DELs)
        self.stack.callback(lambda: [d.stop() for d in started])
        return started

    def containerd(self, name: str, conf_dir: Path, bin_dirs: list, **kw) -> Containerd:
        return self.runtime(Containerd, f"ctd-{name}", conf_dir, bin_dirs, **kw)

    def runtime(self, kind, dirname: str, conf_dir: Path, bin_dirs: list, **kw):
        """A private runtime instance of `kind` (tests/support: Containerd, Crio), started;
        cleaned up with the bench."""
        rt = kind(self.tmp / dirname, cni_conf_dir=conf_dir, cni_bin_dirs=bin_dirs, pause=self.pause, **kw)
        self.stack.callback(lambda: self.problems.extend(rt.cleanup()))
        rt.start()
        return rt

    def floor(
        self,
        name: str,
        start_runtime: Callable[[str, Path, list, BridgeNetwork], Any],
        net: BridgeNetwork | None = None,
    ) -> Mode:
        """The runtime (started by `start_runtime(name, conf_dir, bin_dirs, net)`) running its own
        list (`net`'s, by default a bridge + host-local + portmap list of its own) with the
        compiled shim chained after its last plugin, pointed at bench/null_plugin.py, which
        answers it at once and hears the pod's NRI events as nri-cni does, doing nothing: what
        any shim set-up costs whatever its daemon does."""
        nulls: list[subprocess.Popen] = []
        self.stack.callback(stop_nulls, nulls)  # after the runtime's cleanup (its pods' DELs)
        net = net or self.bridge_net(name)
        setup = self.shim_setup(name)
        chain_null_shim(net, setup.socket)
        rt = start_runtime(name, net.conf_dir, [setup.bin_dir], net)
        nulls.append(start_null(self.nri_path(setup, rt.nri_socket), setup.socket))
        return Mode(name, rt, net, ipam_dirs=[net.ipam_dir])

    def nri_path(self, setup: ShimSetup, nri_socket: str) -> str:
        """Where a plugin of `setup` reaches the runtime's NRI socket (profile_pod puts a tap
        there)."""
        return nri_socket

    def shim_setup(self, name: str) -> ShimSetup:
        d = self.tmp / f"nri-cni-{name}"
        d.mkdir()
        setup = ShimSetup(d)
        self.stack.callback(setup.cleanup)
        return setup

    def nri_cni(self, daemons: list[NriCni], setup: ShimSetup, cfg: dict) -> NriCni:
        """An nri-cni daemon of `setup` with `cfg`, started; stopped with `daemons`."""
        daemon = NriCni(setup.tmp, cfg)
        daemons.append(daemon)
        daemon.start()
        return daemon

    # -- the alternation -----------------------------------------------------------------------

    def run_leaving_nothing(self, modes: list[Mode], daemon: NriCni) -> None:
        """run(), then nri-cni must list no pod."""
        self.run(modes)
        if daemon.pods():
            raise RuntimeError(f"nri-cni still lists pods: {daemon.pods()}")

    # the CRI calls' stamps' clock; a profile that lines them up with other witnesses (the
    # kernel's process events, runtime logs) uses the wall clock
    clock = staticmethod(time.perf_counter)

    def ran(self, mode: Mode, pod: str, t0: float, t1: float) -> None:
        """A measured pod's RunPodSandbox ran from t0 to t1."""

    def stopped(self, mode: Mode, pod: str, t0: float, t1: float, t2: float) -> None:
        """A measured pod's StopPodSandbox ran from t0 to t1 and its RemovePodSandbox to t2."""

    def created(self, mode: Mode, pod: str, measured: bool) -> None:
        """A pod was created and checked (outside the timing), before any pod is stopped."""

    def run(self, modes: list[Mode]) -> None:
        n = self.args.warmup + self.args.pods
        for i in range(n):
            k = i % len(modes)
            order = modes[k:] + modes[:k]
            pods: dict[str, str] = {}
            measured = i >= self.args.warmup
            for m in order:
                ports = []
                if self.args.host_ports:
                    ports = [
                        {
                            "container_port": 80,
                            "host_port": HOST_PORT_BASE[m.name] + i,
                            "host_ip": m.net.gateway,
                        }
                    ]
                name = f"{m.name}-{i}-{uuid.uuid4().hex[:6]}"
                t0 = self.clock()
                pods[m.name] = m.ctd.cri.run_pod(name, NAMESPACE, str(uuid.uuid4()), port_mappings=ports)
                t1 = self.clock()
                if measured:
                    m.run_ms.append((t1 - t0) * 1000)
                    self.ran(m, pods[m.name], t0, t1)
                    m.measured_pods.add(pods[m.name])
                    m.run_order.append(pods[m.name])
            for m in order:
                m.check(pods[m.name])
                self.created(m, pods[m.name], measured)
            for m in order:
                t0 = self.clock()
                m.ctd.cri.stop_pod(pods[m.name])
                t1 = self.clock()
                m.ctd.cri.remove_pod(pods[m.name])
                t2 = self.clock()
                if measured:
                    m.stop_ms.append((t1 - t0) * 1000)
                    m.remove_ms.append((t2 - t1) * 1000)
                    self.stopped(m, pods[m.name], t0, t1, t2)
                leftover = cni_cache_files(pods[m.name])
                if leftover:
                    raise RuntimeError(f"{m.name}: libcni cache entries remain: {leftover}")
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{n} pods per mode", flush=True)
        for m in modes:
            for d in m.ipam_dirs:
                held = host_local_reservations(d)
                if held:
                    raise RuntimeError(f"{m.name}: host-local still holds {held}")

    # -- part 1: shim vs native ----------------------------------------------------------------

    def part_shim(self) -> dict:
        daemons = self.daemons()
        native_net = self.bridge_net("native")
        shim_net = self.bridge_net("shim")  # its list runs inside nri-cni; its conf dir is unused
        setup = self.shim_setup("shim")
        native = Mode(
            "native",
            self.containerd("native", native_net.conf_dir, [cni_plugin_dir()]),
            native_net,
            ipam_dirs=[native_net.ipam_dir],
        )
        ctd = self.containerd("shim", setup.conf_dir, [setup.bin_dir])
        cfg = setup.config(
            ctd.nri_socket, [{"name": shim_net.name, "default": True, "conflist": shim_net.conflist}]
        )
        daemon = self.nri_cni(daemons, setup, cfg)
        shim = Mode("shim", ctd, shim_net, ipam_dirs=[shim_net.ipam_dir], daemon=daemon)
        floor = self.floor("floor", lambda name, conf_dir, bins, _net: self.containerd(name, conf_dir, bins))
        print(f"part 1: shim vs native, {self.args.pods} pods each (+{self.args.warmup} warm-up), alternated")
        self.run_leaving_nothing([native, shim, floor], daemon)
        out = self.report([native, shim, floor], "shim", "native")
        out["floor"] = floor_compare(out["modes"], own="native", shim="shim", floor="floor")
        print(describe_floor(out["floor"], "containerd's own"))
        return out

    # -- part 2: secondary vs native max_conf_num = 2 ------------------------------------------

    def part_secondary(self) -> dict:
        daemons = self.daemons()
        jan = self.janitor()
        modes: list[Mode] = []
        # native2: containerd runs the bridge list and the macvlan list (eth0, eth1), at once;
        # native2s: one after the other (cni.setup_serially)
        for name, serial in (("native2", False), ("native2s", True)):
            n2_net = self.bridge_net(name)
            n2_master, _ = jan.veth()
            n2_ipam = self.tmp / f"ipam-{name}-extra"
            extra = macvlan_list(
                f"nct-bench-extra-{secrets.token_hex(3)}", n2_master, SUBNETS[f"{name}-extra"], n2_ipam
            )
            (n2_net.conf_dir / "20-nct-extra.conflist").write_text(json.dumps(extra))
            cri = {"plugins": {CRI_RT: {"cni": {"setup_serially": True}}}} if serial else None
            modes.append(
                Mode(
                    name,
                    self.containerd(name, n2_net.conf_dir, [cni_plugin_dir()], max_conf_num=2, extra=cri),
                    n2_net,
                    extra_if="eth1",
                    ipam_dirs=[n2_net.ipam_dir, n2_ipam],
                )
            )
        # secondary: containerd runs the bridge list, nri-cni adds the macvlan list (net1)
        sec_net = self.bridge_net("secondary")
        sec_master, _ = jan.veth()
        setup = self.shim_setup("secondary")
        sec_ipam = self.tmp / "ipam-secondary-extra"
        ctd = self.containerd("secondary", sec_net.conf_dir, [cni_plugin_dir()])
        fastnet = macvlan_list("fastnet", sec_master, SUBNETS["secondary-extra"], sec_ipam)
        cfg = setup.config(
            ctd.nri_socket,
            [{"name": "fastnet", "default": True, "conflist": fastnet}],
            mode="secondary",
            primary_network=sec_net.name,
        )
        cfg["cni"]["runtime_cache_dir"] = "/var/lib/cni"  # containerd's libcni cache
        daemon = self.nri_cni(daemons, setup, cfg)
        modes.append(
            Mode(
                "secondary",
                ctd,
                sec_net,
                extra_if="net1",
                ipam_dirs=[sec_net.ipam_dir, sec_ipam],
                daemon=daemon,
            )
        )
        if not self.args.no_base:
            base_net = self.bridge_net("base")
            modes.append(
                Mode(
                    "base",
                    self.containerd("base", base_net.conf_dir, [cni_plugin_dir()]),
                    base_net,
                    ipam_dirs=[base_net.ipam_dir],
                )
            )
        print(
            f"part 2: secondary vs native2 (max_conf_num 2){'' if self.args.no_base else ' vs base'}"
            f", {self.args.pods} pods each (+{self.args.warmup} warm-up), alternated"
        )
        self.run_leaving_nothing(modes, daemon)
        out = self.report(modes, "secondary", "native2")
        if self.args.burst:
            out["burst"] = self.burst([m for m in modes if m.name in ("native2", "secondary")])
            if daemon.pods():
                raise RuntimeError(f"nri-cni still lists pods: {daemon.pods()}")
        return out

    # -- throughput: many pods at once ---------------------------------------------------------

    def burst(self, modes: list[Mode]) -> dict:
        """--burst pods created --burst-parallel at a time in each mode (kubelet starts pods
        of a node in parallel; containerd serializes every NRI call of the node, so nri-cni's
        time in RunPodSandbox is on every pod's path): pods/s from the first RunPodSandbox
        sent to the last answered. Modes take turns, twice, the order reversed the second
        time; the pods are checked, then removed (untimed) before the next mode's burst."""
        n, par = self.args.burst, self.args.burst_parallel
        rates: dict[str, list[float]] = {m.name: [] for m in modes}
        for order in (modes, modes[::-1]):
            for m in order:
                names = [f"{m.name}-burst-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]
                with ThreadPoolExecutor(par) as pool:
                    t0 = time.perf_counter()
                    pods = list(
                        pool.map(lambda nm, m=m: m.ctd.cri.run_pod(nm, NAMESPACE, str(uuid.uuid4())), names)
                    )
                    secs = time.perf_counter() - t0
                    try:
                        list(pool.map(m.check, pods))
                    finally:
                        list(pool.map(lambda p, m=m: (m.ctd.cri.stop_pod(p), m.ctd.cri.remove_pod(p)), pods))
                rates[m.name].append(n / secs)
        out = {name: round(statistics.median(r), 2) for name, r in rates.items()}
        out["runs"] = rates
        a, b = modes[1].name, modes[0].name
        out["ratio"] = round(out[a] / out[b], 3)
        print(
            f"burst: {n} pods {par} at a time, pods/s (median of 2): "
            + ", ".join(f"{name} {out[name]:.1f}" for name in rates)
            + f"; {a}/{b} {out['ratio']:.3f}"
        )
        return out

    # -- output --------------------------------------------------------------------------------

    @staticmethod
    def daemon_ops(m: Mode) -> dict:
        """nri-cni's own account of the measured pods (its op log lines): per verb, the
        median of the whole operation and of the time spent in plugins."""
        out = {}
        for op in ("add", "del"):
            lines = [
                ln
                for ln in m.daemon.op_lines()
                if ln["op"] == op and ln["podId"] in m.measured_pods and ln["networks"]
            ]
            if not lines:
                continue
            total = [ln["ms"] for ln in lines]
            plugins = [sum(p["ms"] for p in ln["plugins"]) for ln in lines]
            own = [t - p for t, p in zip(total, plugins)]
            out[op] = {
                "ops": len(lines),
                "median_ms": round(statistics.median(total), 2),
                "plugins_median_ms": round(statistics.median(plugins), 2),
                "own_median_ms": round(statistics.median(own), 2),
            }
            print(
                f"  nri-cni in {m.name}, {op.upper()}: median {out[op]['median_ms']:.1f} ms, of "
                f"which plugins {out[op]['plugins_median_ms']:.1f} ms, nri-cni itself "
                f"{out[op]['own_median_ms']:.1f} ms ({len(lines)} ops)"
            )
        return out

    def report(self, modes: list[Mode], a: str, b: str) -> dict:
        by = {m.name: m for m in modes}
        out: dict = {"modes": {}}
        print(
            f"{'mode':<10} {'run median':>11} {'run p90':>8} {'stop+rm median':>15} {'p90':>7}"
            f"   (stop / remove medians)"
        )
        for m in modes:
            sr = [s + r for s, r in zip(m.stop_ms, m.remove_ms)]
            out["modes"][m.name] = {
                "run": _summary(m.run_ms),
                "stop_remove": _summary(sr),
                "stop": _summary(m.stop_ms),
                "remove": _summary(m.remove_ms),
                "raw": {"run": m.run_ms, "stop": m.stop_ms, "remove": m.remove_ms},
            }
            s = out["modes"][m.name]
            print(
                f"{m.name:<10} {s['run']['median']:>9.1f}ms {s['run']['p90']:>6.1f}ms "
                f"{s['stop_remove']['median']:>13.1f}ms {s['stop_remove']['p90']:>5.1f}ms"
                f"   ({s['stop']['median']:.1f} / {s['remove']['median']:.1f})"
            )
        for m in modes:
            if m.daemon is not None:
                out["modes"][m.name]["nri_cni_ops"] = self.daemon_ops(m)
        ma, mb = by[a], by[b]
        sr_a = [s + r for s, r in zip(ma.stop_ms, ma.remove_ms)]
        sr_b = [s + r for s, r in zip(mb.stop_ms, mb.remove_ms)]
        cmp = {
            "run_median_ratio": round(statistics.median(ma.run_ms) / statistics.median(mb.run_ms), 3),
            "run_per_pod_ratio_median": round(
                statistics.median(x / y for x, y in zip(ma.run_ms, mb.run_ms)), 3
            ),
            "run_median_diff_ms": round(statistics.median(ma.run_ms) - statistics.median(mb.run_ms), 2),
            "run_per_pod_diff_median_ms": round(
                statistics.median(x - y for x, y in zip(ma.run_ms, mb.run_ms)), 2
            ),
            "stop_remove_median_ratio": round(statistics.median(sr_a) / statistics.median(sr_b), 3),
            "stop_remove_median_diff_ms": round(statistics.median(sr_a) - statistics.median(sr_b), 2),
            "run_median_ratio_interval": ratio_interval(ma.run_ms, mb.run_ms),
            "stop_remove_median_ratio_interval": ratio_interval(sr_a, sr_b),
        }
        print(
            f"{a}/{b} RunPodSandbox: median ratio {cmp['run_median_ratio']:.3f} "
            f"({describe_interval(cmp['run_median_ratio_interval'])}; per-pod ratios, median {cmp['run_per_pod_ratio_median']:.3f}), difference "
            f"{cmp['run_median_diff_ms']:+.1f} ms (per-pod differences, median "
            f"{cmp['run_per_pod_diff_median_ms']:+.1f} ms)"
        )
        print(
            f"{a}/{b} Stop+Remove:   median ratio {cmp['stop_remove_median_ratio']:.3f} "
            f"({describe_interval(cmp['stop_remove_median_ratio_interval'])}), difference {cmp['stop_remove_median_diff_ms']:+.1f} ms"
        )
        if "base" in by:
            base_run = statistics.median(by["base"].run_ms)
            base_sr = statistics.median([s + r for s, r in zip(by["base"].stop_ms, by["base"].remove_ms)])
            for name in (a, b, *(["native2s"] if "native2s" in by else [])):
                m = by[name]
                extra_run = statistics.median(m.run_ms) - base_run
                extra_sr = statistics.median([s + r for s, r in zip(m.stop_ms, m.remove_ms)]) - base_sr
                cmp[f"{name}_extra_over_base_ms"] = {
                    "run": round(extra_run, 2),
                    "stop_remove": round(extra_sr, 2),
                }
                print(
                    f"  the extra network in {name}: {extra_run:+.1f} ms run, "
                    f"{extra_sr:+.1f} ms stop+remove (over base medians)"
                )
            mine = cmp[f"{a}_extra_over_base_ms"]["run"]
            for anchor in (b, "native2s"):
                theirs = cmp.get(f"{anchor}_extra_over_base_ms", {}).get("run")
                if theirs and theirs > 0:
                    cmp[f"extra_ratio_vs_{anchor}"] = round(mine / theirs, 2)
                    print(f"  the extra network, {a} / {anchor}: {mine / theirs:.2f}x")
        out["compare"] = cmp
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=40, help="measured pods per mode (default 40)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured pods first (default 3)")
    ap.add_argument(
        "--part",
        choices=("1", "2", "all"),
        default="all",
        help="1: shim vs native; 2: secondary vs native2 (default both)",
    )
    ap.add_argument("--no-base", action="store_true", help="part 2 without the bridge-only instance")
    ap.add_argument(
        "--host-ports", action="store_true", help="one port mapping per pod (portmap then adds DNAT rules)"
    )
    ap.add_argument(
        "--burst",
        type=int,
        default=32,
        help="part 2: then this many pods at once per mode, pods/s (default 32; 0: none)",
    )
    ap.add_argument("--burst-parallel", type=int, default=8, help="pods at a time in the burst (default 8)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw times and summary here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_pods: needs root (containerd, netns, iptables)", file=sys.stderr)
        return 2
    if args.pods < 2:
        ap.error("--pods must be at least 2")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        report = measure(args)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"bench_pods: interrupted ({exc or 'Ctrl-C'}); cleaned up", file=sys.stderr)
        return 130
    except CleanupProblems as exc:
        print(f"bench_pods: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


class CleanupProblems(RuntimeError):
    pass


def measure(args) -> dict:
    """The parts of args.part; prints the tables, returns the report. Raises CleanupProblems
    when something made could not be removed (after every part ran)."""
    report: dict = {
        "pods": args.pods,
        "warmup": args.warmup,
        "host_ports": args.host_ports,
        "python": sys.version.split()[0],
    }
    all_problems: list[str] = []
    parts: list[tuple[str, Callable[[Bench], dict]]] = []
    if args.part in ("1", "all"):
        parts.append(("shim_vs_native", Bench.part_shim))
    if args.part in ("2", "all"):
        parts.append(("secondary_vs_native2", Bench.part_secondary))
    for key, part in parts:
        problems: list[str] = []
        with contextlib.ExitStack() as stack:
            bench = Bench(args, stack)
            try:
                report[key] = part(bench)
            finally:
                problems = bench.problems  # filled while the stack unwinds, below
        all_problems += problems
    if all_problems:
        raise CleanupProblems("cleanup problems:\n  " + "\n  ".join(all_problems))
    return report


if __name__ == "__main__":
    sys.exit(main())
