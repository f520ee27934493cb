#!/usr/bin/env python3
"""Pod latency through a real CRI-O 1.36: nri-cni's modes against CRI-O's own CNI.

bench_pods.py's method (its Bench and Mode: pods driven over CRI one at a time, the modes
ALTERNATED pod by pod, the order rotating every pod, each pod checked after its RunPodSandbox,
no libcni cache entry left after its removal, no host-local reservation at the end) with
private CRI-O instances (tests/support/crio.py) in containerd's place:

  crio-shim  CRI-O's only CNI network is the shipped shim list (config/crio/net.d, its socket
             pointed at the bench's daemon; the shipped drop-in picks it); the nri-cni daemon
             runs the pod's bridge + host-local + portmap list. CRI-O runs CNI CHECK after each
             ADD, which nri-cni answers from its records.
     vs
  crio       CRI-O runs the same bridge + host-local + portmap list itself (no NRI plugin).
     and
  crio-floor CRI-O runs that list itself with the compiled shim chained after portmap, pointed at
             bench/null_plugin.py, which answers the shim at once and hears the pod's NRI events
             as nri-cni does, doing nothing: what any shim set-up costs whatever its daemon
             does (the shim's exec, stdin, socket round trip and exit, the NRI round trips).

  crio-sec   CRI-O runs the bridge list (eth0); nri-cni (mode: secondary) adds a macvlan +
             host-local network (net1) on NRI RUN_POD_SANDBOX and DELs it on NRI STOP.
     and
  crio-base  CRI-O with the bridge list only: what the extra network costs. (CRI-O runs one
             CNI network per pod: it has no second network of its own to compare with.)

Output as bench_pods.py's: per mode medians and p90 (ms), crio-shim/crio ratios of
RunPodSandbox and of StopPodSandbox + RemovePodSandbox, crio-floor/crio and
crio-shim/crio-floor, and the extra network's cost in crio-sec over crio-base. Part 1 also splits the stop+remove difference into what was measured
of it: the stop's and the remove's differences (medians), nri-cni's DEL of the cached list
(its op lines: plugins and nri-cni itself), the shim's DEL request as nri-cni served it and
nri-cni's answers to NRI StopPodSandbox and RemovePodSandbox (means of the daemon's own
duration metrics, read from its metrics socket at the end; warm-up pods included).
Subnets 10.246.169.0/24 .. 10.246.173.0/24 and 10.246.176.0/24. Everything made is removed
at the end, also on failure, Ctrl-C or SIGTERM. Needs root, the parts from .ci/install-deps and
CRI-O (tests/support/crio.py: available()).
Run:  sudo ./.venv/bin/python bench/bench_crio.py [--pods 40] [--part 1|2|all]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import bench_pods  # noqa: E402
from bench.bench_pods import Bench, Mode, macvlan_list  # noqa: E402
from nri_cni.local import proto as localproto  # noqa: E402
from tests.support.containerd import cni_plugin_dir  # noqa: E402
from tests.support.crio import Crio, available, install_shim_conflist  # noqa: E402

bench_pods.SUBNETS.update(
    {
        "crio": "10.246.169.0/24",
        "crio-shim": "10.246.170.0/24",
        "crio-sec": "10.246.171.0/24",
        "crio-sec-extra": "10.246.172.0/24",
        "crio-base": "10.246.173.0/24",
        "crio-floor": "10.246.176.0/24",
    }
)


class CrioBench(Bench):
    shim_checks: list[float]  # per measured crio-shim pod, in run_ms' order: the plugins' CHECK, ms

    def created(self, mode: Mode, pod: str, measured: bool) -> None:
        """A measured crio-shim pod: what the plugins' CHECK of it costs nri-cni (the work a
        forwarded CHECK does), as the time of `nri-cni verify --pod ID --check` over the same
        without --check (netlink only), both through the daemon's local socket, alternated."""
        if mode.name != "crio-shim" or not measured or mode.daemon is None:
            return
        times = {}
        order = (False, True) if len(self.shim_checks) % 2 else (True, False)
        for check in order:
            body = json.dumps({"pod": pod, "check": check}).encode()
            t0 = time.perf_counter()
            status, payload = localproto.call(
                mode.daemon.socket, {localproto.OP_KEY: "verify"}, body, timeout=60
            )
            times[check] = (time.perf_counter() - t0) * 1000
            verdicts = json.loads(payload or b"null")
            if status or not verdicts or any(v["state"] != "ok" for v in verdicts):
                raise RuntimeError(f"crio-shim: verify of pod {pod[:12]} (check={check}): {verdicts}")
        self.shim_checks.append(times[True] - times[False])

    def crio(self, name: str, conf_dir: Path, bin_dirs: list, **kw) -> Crio:
        return self.runtime(Crio, f"crio-{name}", conf_dir, bin_dirs, **kw)

    def own_network(self, name: str) -> Mode:
        """CRI-O running a bridge + host-local (+ portmap) list itself."""
        net = self.bridge_net(name)
        crio = self.crio(name, net.conf_dir, [cni_plugin_dir()], default_network=net.name)
        return Mode(name, crio, net, ipam_dirs=[net.ipam_dir])  # type: ignore[arg-type]

    def part_shim(self) -> dict:
        daemons = self.daemons()
        own = self.own_network("crio")
        floor = self.floor(
            "crio-floor",
            lambda name, conf_dir, bins, net: self.crio(name, conf_dir, bins, default_network=net.name),
        )
        shim_net = self.bridge_net("crio-shim")  # its list runs inside nri-cni
        setup = self.shim_setup("crio-shim")
        install_shim_conflist(setup.conf_dir, setup.socket)
        crio = self.crio("crio-shim", setup.conf_dir, [setup.bin_dir])
        cfg = setup.config(
            crio.nri_socket, [{"name": shim_net.name, "default": True, "conflist": shim_net.conflist}]
        )
        metrics_socket = str(setup.sock_dir / "metrics.sock")
        cfg["metrics"] = {"listen": metrics_socket}
        daemon = self.nri_cni(daemons, setup, cfg)
        shim = Mode("crio-shim", crio, shim_net, ipam_dirs=[shim_net.ipam_dir], daemon=daemon)  # type: ignore[arg-type]
        print(
            f"CRI-O part 1: shim vs CRI-O's own CNI, {self.args.pods} pods each (+{self.args.warmup} warm-up)"
        )
        self.shim_checks = []
        self.run_leaving_nothing([own, shim, floor], daemon)
        out = self.report([own, shim, floor], "crio-shim", "crio")
        out["floor"] = bench_pods.floor_compare(
            out["modes"], own="crio", shim="crio-shim", floor="crio-floor"
        )
        print(bench_pods.describe_floor(out["floor"], "CRI-O's own"))
        records = {
            op["podId"]: records_check_ms(op)
            for op in daemon.op_lines()
            if op["op"] == "check" and op.get("from") == "records" and op["podId"] in shim.measured_pods
        }
        out["checks_from_records"] = len(records)
        out["checks"] = len(shim.measured_pods)
        print(
            f"  CRI-O's CHECK after ADD: {out['checks_from_records']} of {out['checks']} answered from the records"
        )
        out["forwarded"] = forwarded_check(
            shim.run_ms, sorted_by_run(shim, records), self.shim_checks, own.run_ms, floor.run_ms
        )
        text = scrape_metrics(metrics_socket)
        out["stop_remove_split"] = stop_remove_split(out, text)
        return out

    def part_secondary(self) -> dict:
        daemons = self.daemons()
        jan = self.janitor()
        base = self.own_network("crio-base")
        net = self.bridge_net("crio-sec")
        master, _ = jan.veth()
        setup = self.shim_setup("crio-sec")
        ipam = self.tmp / "ipam-crio-sec-extra"
        crio = self.crio("crio-sec", net.conf_dir, [cni_plugin_dir()], default_network=net.name)
        fastnet = macvlan_list("fastnet", master, bench_pods.SUBNETS["crio-sec-extra"], ipam)
        cfg = setup.config(
            crio.nri_socket,
            [{"name": "fastnet", "default": True, "conflist": fastnet}],
            mode="secondary",
            primary_network=net.name,
        )
        cfg["cni"]["runtime_cache_dir"] = "/var/lib/cni"  # CRI-O's libcni cache
        daemon = self.nri_cni(daemons, setup, cfg)
        sec = Mode("crio-sec", crio, net, extra_if="net1", ipam_dirs=[net.ipam_dir, ipam], daemon=daemon)  # type: ignore[arg-type]
        print(
            f"CRI-O part 2: secondary vs bridge only, {self.args.pods} pods each (+{self.args.warmup} warm-up)"
        )
        self.run_leaving_nothing([base, sec], daemon)
        out = self.report([base, sec], "crio-sec", "crio-base")
        print(
            f"  the extra network on CRI-O: {out['compare']['run_median_diff_ms']:+.1f} ms run, "
            f"{out['compare']['stop_remove_median_diff_ms']:+.1f} ms stop+remove (over crio-base medians)"
        )
        return out


def sorted_by_run(mode: Mode, by_pod: dict[str, float]) -> list[float | None]:
    """`by_pod`'s values in the order of mode.run_ms (the pods' creation order)."""
    return [by_pod.get(pod) for pod in mode.run_order]


def records_check_ms(op: dict) -> float:
    """How long answering a CHECK from the records took nri-cni: from the shim's request decoded
    (the op record's `decoded` mark, ms before its start) to the answer (its end). The pod's lock,
    `fresh_add` and netlink's look come before the record starts: a forwarded CHECK does none of
    them (its own lock and cache read are in the plugins' CHECK time), so they are taken out too.
    The shim's exec, connect, request and exit stay: a forwarded CHECK pays them as well."""
    decoded = op.get("marks", {}).get("decoded")
    if not isinstance(decoded, (int, float)) or decoded > 0:
        raise RuntimeError(f"crio-shim: a CHECK from records without its decoded mark: {op}")
    return float(op["ms"]) - decoded


def forwarded_check(
    runs: list[float], records: list, checks: list[float], own: list[float], floor: list[float]
) -> dict:
    """crio-shim's creation as it would be with the plugins' CHECK forwarded, per pod: its
    RunPodSandbox, less its CHECK answered from the records (`records_check_ms`), plus the
    plugins' CHECK of the same pod as nri-cni runs it (CrioBench.created): the same work as
    CRI-O's own network, which runs the plugins' CHECK after each ADD. A pod whose CHECK was not
    answered from the records ran the plugins' CHECK: its RunPodSandbox counts as measured.
    Compared with CRI-O's own pods (`own`) and with the floor's (`floor`: CRI-O's own network
    and a null shim, which also runs the plugins' CHECK)."""
    if len(runs) != len(records) or len(runs) != len(checks):
        raise RuntimeError(
            f"crio-shim: {len(runs)} pods, {len(records)} CHECK records, {len(checks)} CHECK times"
        )
    # a pod whose CHECK was not answered from the records ran the plugins' CHECK: as measured
    per_pod = [r if rec is None else r - rec + c for r, rec, c in zip(runs, records, checks)]
    out = {
        "run_median": round(statistics.median(per_pod), 2),
        "records_check_median_ms": round(
            statistics.median([r for r in records if r is not None] or [0.0]), 2
        ),
        "plugins_check_median_ms": round(statistics.median(checks), 2),
    }
    out["run_median_ratio"] = round(out["run_median"] / statistics.median(own), 3)
    out["run_median_ratio_interval"] = bench_pods.ratio_interval(per_pod, own)
    out["over_floor"] = round(out["run_median"] / statistics.median(floor), 3)
    out["over_floor_interval"] = bench_pods.ratio_interval(per_pod, floor)
    print(
        f"  with the plugins' CHECK forwarded (per pod: run - CHECK from records, decoded -> answered "
        f"{out['records_check_median_ms']:.2f} ms + the plugins' CHECK {out['plugins_check_median_ms']:.2f} ms, "
        f"medians): {out['run_median']:.1f} ms, {out['run_median_ratio']:.3f} of CRI-O's own "
        f"({bench_pods.describe_interval(out['run_median_ratio_interval'])}), {out['over_floor']:.3f} of the "
        f"floor's ({bench_pods.describe_interval(out['over_floor_interval'])})"
    )
    return out


def scrape_metrics(path: str) -> str:
    """The daemon's metrics text, over its unix socket (HTTP/1.0)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _mean_ms(text: str, family: str, label: str, value: str) -> float | None:
    """A histogram child's mean (sum / count), ms; None when it saw nothing."""
    found = {}
    for part in ("sum", "count"):
        m = re.search(rf'^{family}_{part}{{{label}="{value}"}} (\S+)$', text, re.M)
        found[part] = float(m.group(1)) if m else 0.0
    return found["sum"] / found["count"] * 1000 if found["count"] else None


def stop_remove_split(out: dict, metrics: str) -> dict:
    """What was measured of crio-shim's stop+remove over crio's; printed, and returned for the
    bench's "why" line."""
    shim, own = out["modes"]["crio-shim"], out["modes"]["crio"]
    dele = shim.get("nri_cni_ops", {}).get("del", {})
    split = {
        "stop_diff_ms": round(shim["stop"]["median"] - own["stop"]["median"], 2),
        "remove_diff_ms": round(shim["remove"]["median"] - own["remove"]["median"], 2),
        "del_median_ms": dele.get("median_ms"),
        "del_plugins_median_ms": dele.get("plugins_median_ms"),
        "del_own_median_ms": dele.get("own_median_ms"),
        "shim_del_mean_ms": _mean_ms(metrics, "nri_cni_shim_request_duration_seconds", "verb", "DEL"),
        "nri_stop_mean_ms": _mean_ms(
            metrics, "nri_cni_nri_request_duration_seconds", "method", "StopPodSandbox"
        ),
        "nri_remove_mean_ms": _mean_ms(
            metrics, "nri_cni_nri_request_duration_seconds", "method", "RemovePodSandbox"
        ),
    }
    print(f"  stop+remove split: {describe_split(split)}")
    return split


def describe_split(split: dict) -> str:
    """The split as one sentence (the bench's "why" line for the stop+remove row)."""

    def ms(key: str) -> str:
        value = split.get(key)
        return "?" if value is None else f"{value:.1f}"

    return (
        f"stop {split['stop_diff_ms']:+.1f} ms, remove {split['remove_diff_ms']:+.1f} ms over CRI-O's own "
        f"(medians); in the stop, nri-cni's DEL of the cached list {ms('del_median_ms')} ms, of which the "
        f"plugins (the bridge and portmap DELs CRI-O runs itself) {ms('del_plugins_median_ms')} ms and "
        f"nri-cni itself {ms('del_own_median_ms')} ms; the shim's DEL request as nri-cni served it "
        f"{ms('shim_del_mean_ms')} ms; nri-cni's answers to NRI StopPodSandbox {ms('nri_stop_mean_ms')} ms "
        f"and RemovePodSandbox {ms('nri_remove_mean_ms')} ms (means); the rest is the shim (its exec, "
        "its socket round trip: one more process to wake on the stop's path) and the machine's noise; "
        "bench/profile_crio_stop.py splits the stop step by step"
    )


def measure(args) -> dict:
    """The parts of args.part (CRI-O's); prints the tables, returns the report. Raises
    bench_pods.CleanupProblems when something made could not be removed."""
    if not available():
        raise RuntimeError("no CRI-O: .ci/install-deps unpacks it from $NRI_CNI_CRIO_DIR")
    report: dict = {"pods": args.pods, "warmup": args.warmup}
    problems: list[str] = []
    parts = {"1": ("shim_vs_crio", CrioBench.part_shim), "2": ("secondary_vs_base", CrioBench.part_secondary)}
    for key, part in parts.values() if args.part == "all" else [parts[args.part]]:
        with contextlib.ExitStack() as stack:
            bench = CrioBench(args, stack)
            try:
                report[key] = part(bench)
            finally:
                problems += bench.problems  # filled while the stack unwinds
    if problems:
        raise bench_pods.CleanupProblems("cleanup problems:\n  " + "\n  ".join(problems))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=40, help="measured pods per mode (default 40)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured pods first (default 3)")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all", help="1: shim vs own; 2: secondary")
    ap.add_argument("--json", metavar="FILE", help="also write the raw times and summary here")
    args = ap.parse_args(argv)
    args.host_ports = False
    if os.geteuid() != 0:
        print("bench_crio: needs root (CRI-O, netns, iptables)", file=sys.stderr)
        return 2
    if args.pods < 2:
        ap.error("--pods must be at least 2")
    signal.signal(signal.SIGTERM, bench_pods._on_sigterm)
    try:
        report = measure(args)
    except (KeyboardInterrupt, bench_pods.Interrupted) as exc:
        print(f"bench_crio: interrupted ({exc or 'Ctrl-C'}); cleaned up", file=sys.stderr)
        return 130
    except bench_pods.CleanupProblems as exc:
        print(f"bench_crio: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
