#!/usr/bin/env python3
"""nri-cni's CNI runtime against the floor: the same plugin binaries exec'd directly.

Two chains, each run for N pods, the two drivers ALTERNATED pod by pod (A then B for even
pods, B then A for odd ones) so that drift of the machine hits both alike:

  real   bridge + host-local + portmap (the reference plugins, one portMapping per pod)
  noop   three no-op plugins (a static C program built here with gcc): they read stdin and
         print their prevResult (or a minimal result); what is left is nri-cni's own cost,
         with the cache dir on the temp dir's file system (a disk here, like /var/lib/cni)
  real-tmpfs, noop-tmpfs   the same with nri-cni's cache dir on /dev/shm: without the cost of
         the cache's fsyncs (which also wait for whatever else is dirty on that file system)

The floor driver does what a runtime must do and nothing more: per plugin, inject name,
cniVersion, runtimeConfig and prevResult into the config, os.posix_spawn the binary with stdin
in a pipe and the six CNI_* variables appended to the environment, read stdout, wait. DEL gets
the ADD result as prevResult (kept in memory: the floor writes no cache file; nri-cni's cache
write and read are part of what is measured).

nri-cni is driven as the daemon drives it: its CNIRuntime awaited inside an event loop that is
already running, with the daemon's GC settings (nri_cni.cli.gctune). The floor's blocking calls run
in that same loop.

Output: per chain and verb, the medians, the median of the per-pod ratios nri-cni/floor, and
for the noop chain nri-cni's own cost per plugin call (median of per-pod differences / 3).
Goals: `cni_floor`, `cni_libcni` and `own_call` in bench/goals.py.

Everything the bench makes (netns, bridge, veths, iptables rules, host-local reservations,
cache, temp dir) is removed at the end, also on failure or Ctrl-C. Needs root.
Run:  sudo ./.venv/bin/python bench/bench_cni.py [--pods 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.goals import GOALS, met  # noqa: E402
from nri_cni.cli.gctune import tune_gc  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.firewall import iptables_lines, remove_cni_scaffolding  # noqa: E402
from tests.support.hostlocal import host_local_reservations  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402  (netns/bridge helpers with cleanup)
from tests.support.names import free_subnet, unique_name  # noqa: E402

CNI_VERSION = "1.1.0"
CHAINS = ("real", "real-tmpfs", "noop", "noop-tmpfs")

NOOP_C = r"""
/* A no-op CNI plugin: ADD prints the prevResult object of its config (or a minimal result),
   VERSION prints the supported versions, every other command prints nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char buf[1 << 20];

int main(void) {
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(0, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    const char *cmd = getenv("CNI_COMMAND");
    if (!cmd) return 1;
    if (!strcmp(cmd, "VERSION")) {
        fputs("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\",\"1.1.0\"]}", stdout);
        return 0;
    }
    if (strcmp(cmd, "ADD")) return 0;
    const char *p = strstr(buf, "\"prevResult\":");
    if (!p) {
        fputs("{\"cniVersion\":\"1.1.0\",\"interfaces\":[{\"name\":\"eth0\",\"sandbox\":\"/x\"}],"
              "\"ips\":[{\"address\":\"10.248.255.2/24\",\"interface\":0}],\"dns\":{}}", stdout);
        return 0;
    }
    p = strchr(p + 13, '{');
    if (!p) return 1;
    int depth = 0, in_str = 0;
    const char *q = p;
    for (; *q; q++) {
        if (in_str) {
            if (*q == '\\' && q[1]) q++;
            else if (*q == '"') in_str = 0;
        } else if (*q == '"') in_str = 1;
        else if (*q == '{') depth++;
        else if (*q == '}' && --depth == 0) break;
    }
    if (!*q) return 1;
    fwrite(p, 1, (size_t)(q - p + 1), stdout);
    return 0;
}
"""


# --------------------------------------------------------------------------------------------
# the floor


class Floor:
    """The minimal direct driver (see the module docstring)."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir
        self.base_env = dict(os.environ)

    def _exec(self, path: str, env: dict[str, str], stdin: bytes) -> bytes:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            os.write(in_w, stdin)  # fits: configs here are far below the 64 KiB pipe buffer
            os.close(in_w)
            in_w = -1
            pid = os.posix_spawn(
                path,
                [path],
                env,
                file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1)],
            )
            os.close(out_w)
            out_w = -1
            chunks = []
            while True:
                b = os.read(out_r, 65536)
                if not b:
                    break
                chunks.append(b)
            _, status = os.waitpid(pid, 0)
        finally:
            for fd in (in_r, in_w, out_r, out_w):
                if fd >= 0:
                    os.close(fd)
        out = b"".join(chunks)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{path} failed: {out[:500]!r}")
        return out

    def _env(self, command: str, cid: str, netns: str, ifname: str, cni_args: str) -> dict:
        env = dict(self.base_env)
        env.update(
            CNI_COMMAND=command,
            CNI_CONTAINERID=cid,
            CNI_NETNS=netns,
            CNI_IFNAME=ifname,
            CNI_ARGS=cni_args,
            CNI_PATH=self.bin_dir,
        )
        return env

    @staticmethod
    def _stdin(conflist: dict, plugin: dict, caps: dict, prev: dict | None) -> bytes:
        conf = dict(plugin)
        conf["name"] = conflist["name"]
        conf["cniVersion"] = conflist["cniVersion"]
        if prev is not None:
            conf["prevResult"] = prev
        rc = {k: caps[k] for k, on in (plugin.get("capabilities") or {}).items() if on and k in caps}
        if rc:
            conf["runtimeConfig"] = rc
        return json.dumps(conf, separators=(",", ":")).encode()

    def add(self, conflist: dict, cid: str, netns: str, ifname: str, cni_args: str, caps: dict) -> dict:
        env = self._env("ADD", cid, netns, ifname, cni_args)
        prev = None
        for plugin in conflist["plugins"]:
            out = self._exec(
                os.path.join(self.bin_dir, plugin["type"]), env, self._stdin(conflist, plugin, caps, prev)
            )
            prev = json.loads(out)
        return prev

    def delete(
        self, conflist: dict, cid: str, netns: str, ifname: str, cni_args: str, caps: dict, prev: dict | None
    ) -> None:
        env = self._env("DEL", cid, netns, ifname, cni_args)
        for plugin in reversed(conflist["plugins"]):
            self._exec(
                os.path.join(self.bin_dir, plugin["type"]), env, self._stdin(conflist, plugin, caps, prev)
            )


# --------------------------------------------------------------------------------------------
# the measurement


def build_noop(workdir: Path) -> str:
    """Compile the no-op plugin (static) and install it as noop1..noop3 in a bin dir."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed to build the no-op plugin")
    src = workdir / "noop.c"
    src.write_text(NOOP_C)
    bin_dir = workdir / "noop-bin"
    bin_dir.mkdir()
    exe = bin_dir / "noop1"
    subprocess.run([gcc, "-O2", "-static", "-o", str(exe), str(src)], check=True)
    for name in ("noop2", "noop3"):
        shutil.copy2(exe, bin_dir / name)
    return str(bin_dir)


def run_chain(
    label: str,
    conflist: dict,
    bin_dir: str,
    namespaces,
    pods: int,
    warmup: int,
    cache_dir: str,
    caps_for,
    cni_args: str,
    libcni: str = "",
) -> dict:
    """The drivers over `pods` (+ warmup) pods, inside one running event loop: nri-cni
    is measured as the daemon runs it (its loop already up when a request comes, its GC
    settings), the floor's blocking calls simply hold that loop meanwhile. With `libcni` (the
    Go driver's path) libcni's AddNetworkList / DelNetworkList take part as a third driver,
    timed inside the Go process around the libcni call."""
    return asyncio.run(
        _run_chain(label, conflist, bin_dir, namespaces, pods, warmup, cache_dir, caps_for, cni_args, libcni)
    )


async def _run_chain(
    label: str,
    conflist: dict,
    bin_dir: str,
    namespaces,
    pods: int,
    warmup: int,
    cache_dir: str,
    caps_for,
    cni_args: str,
    libcni: str = "",
) -> dict:
    from bench.golibcni import LibcniDriver
    from nri_cni.cni.config import parse_conflist
    from nri_cni.cni.exec import PluginExecutor
    from nri_cni.cni.runtime import CNIRuntime, RuntimeConf

    net = parse_conflist(json.dumps(conflist).encode(), source=f"bench:{label}")
    rt = CNIRuntime([bin_dir], cache_dir=cache_dir, executor=PluginExecutor())
    floor = Floor(bin_dir)
    pairs = [tuple(kv.split("=", 1)) for kv in cni_args.split(";") if kv]
    floor_args = ";".join(["IgnoreUnknown=1", cni_args]) if cni_args else "IgnoreUnknown=1"
    go_args = [("IgnoreUnknown", "1"), *pairs]  # containerd's go-cni passes it first, too
    drivers = ["nri", "floor"] + (["libcni"] if libcni else [])
    times: dict = {(who, verb): [] for who in drivers for verb in ("ADD", "DEL")}
    go = LibcniDriver(libcni, [bin_dir], cache_dir + "-libcni") if libcni else None
    if go is not None:
        go.load(label, conflist)
    pending: list = []  # (who, state) attached and not yet deleted
    tune_gc()  # what `nri-cni run` does once started

    async def add(who: str, st: dict) -> float | None:
        if who == "nri":
            await rt.add(net, st["conf"])
        elif who == "libcni":
            return go.add(label, st["cid"], st["netns"], "eth0", go_args, st["caps"])
        else:
            st["prev"] = floor.add(conflist, st["cid"], st["netns"], "eth0", floor_args, st["caps"])
        return None

    async def delete(who: str, st: dict) -> float | None:
        if who == "nri":
            await rt.delete(net, st["conf"])
        elif who == "libcni":
            return go.delete(label, st["cid"], st["netns"], "eth0", go_args, st["caps"])
        else:
            floor.delete(conflist, st["cid"], st["netns"], "eth0", floor_args, st["caps"], st.get("prev"))
        return None

    try:
        per = len(drivers)
        slots = len(namespaces) // per  # a netns per driver; rounds > 1 use them again
        for i in range(warmup + pods):
            k = i % slots
            cid_nri = f"nct-b-{uuid.uuid4().hex[:16]}"
            state = {
                "nri": {
                    "conf": RuntimeConf(
                        container_id=cid_nri,
                        netns=namespaces[2 * k],
                        ifname="eth0",
                        args=pairs,
                        capability_args=caps_for(per * i),
                    )
                },
            }
            for j, who in enumerate(drivers[1:], 1):
                state[who] = {
                    "cid": f"nct-b-{uuid.uuid4().hex[:16]}",
                    "netns": namespaces[per * k + j],
                    "caps": caps_for(per * i + j),
                }
            order = drivers[i % per :] + drivers[: i % per]  # rotated pod by pod
            sample = {}
            for who in order:
                pending.append((who, state[who]))  # before the ADD: a failed ADD is owed a DEL too
                t0 = time.perf_counter()
                own = await add(who, state[who])
                sample[(who, "ADD")] = own if own is not None else (time.perf_counter() - t0) * 1000.0
            for who in order:
                t0 = time.perf_counter()
                own = await delete(who, state[who])
                sample[(who, "DEL")] = own if own is not None else (time.perf_counter() - t0) * 1000.0
                pending.remove((who, state[who]))
            if i >= warmup:
                for k, v in sample.items():
                    times[k].append(v)
    finally:
        for who, st in reversed(pending):  # only after a failure: undo what is still attached
            try:
                await delete(who, st)
            except Exception as exc:  # keep going; report
                print(f"bench_cni: cleanup DEL failed: {exc}", file=sys.stderr)
        rt.cache.flush()  # before the cache dir is removed
        if go is not None:
            go.close()
    return times


def summarize(label: str, times: dict, calls_per_op: int | None) -> dict:
    out = {}
    for verb in ("ADD", "DEL"):
        nri, flo = times[("nri", verb)], times[("floor", verb)]
        ratios = [a / b for a, b in zip(nri, flo)]
        diffs = [a - b for a, b in zip(nri, flo)]
        lo, hi = _bootstrap_median_ci(ratios)
        row = {
            "median_paired_ratio_ci95": [lo, hi],
            "nri_median_ms": statistics.median(nri),
            "floor_median_ms": statistics.median(flo),
            "ratio_of_medians": statistics.median(nri) / statistics.median(flo),
            "median_paired_ratio": statistics.median(ratios),
            "median_paired_diff_ms": statistics.median(diffs),
            "nri_p90_ms": sorted(nri)[int(0.9 * (len(nri) - 1))],
            "floor_p90_ms": sorted(flo)[int(0.9 * (len(flo) - 1))],
        }
        if calls_per_op:
            row["own_ms_per_call"] = statistics.median(diffs) / calls_per_op
        go = times.get(("libcni", verb))
        if go:
            row["libcni_median_ms"] = statistics.median(go)
            row["median_paired_ratio_libcni"] = statistics.median(a / b for a, b in zip(nri, go))
        out[verb] = row
    return out


def _bootstrap_median_ci(values: list[float], rounds: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the median (fixed seed: the same data give the same interval).
    It shows how far the machine's noise alone moves the median: a bridge DEL's own time
    varies by +-15% from pod to pod (netns and veth teardown waits on RCU grace periods)."""
    rng = random.Random(1)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


def print_table(label: str, summary: dict, pods: int) -> None:
    print(f"\n{label} ({pods} pods, drivers alternated pod by pod)")
    print(
        f"  {'verb':4} {'nri-cni ms':>11} {'floor ms':>9} {'ratio':>7} {'paired':>7} {'diff ms':>8}"
        f" {'own/call ms':>12}"
    )
    for verb, r in summary.items():
        own = f"{r['own_ms_per_call']:12.3f}" if "own_ms_per_call" in r else f"{'':12}"
        go = ""
        if "libcni_median_ms" in r:
            go = f"   libcni {r['libcni_median_ms']:.2f} ms, paired nri-cni/libcni {r['median_paired_ratio_libcni']:.3f}"
        print(
            f"  {verb:4} {r['nri_median_ms']:11.2f} {r['floor_median_ms']:9.2f}"
            f" {r['ratio_of_medians']:7.3f} {r['median_paired_ratio']:7.3f}"
            f" {r['median_paired_diff_ms']:8.2f} {own}{go}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=50, help="measured pods per chain (default 50)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured pods first (default 3)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="go over the pods' namespaces this many times (default 1): more samples, a narrower interval",
    )
    ap.add_argument(
        "--chains",
        default=",".join(CHAINS),
        help="comma-separated subset of " + ", ".join(CHAINS) + " (default all); "
        "-tmpfs: the cache dir on /dev/shm instead of the temp dir's disk",
    )
    ap.add_argument(
        "--no-libcni",
        action="store_true",
        help="leave out libcni (the Go driver, built at start by bench/go-toolchain.sh)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the raw times and summary here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_cni: needs root (netns, veth, iptables)", file=sys.stderr)
        return 2
    try:
        measure(args)
    except Unusable as exc:
        print(f"bench_cni: {exc}", file=sys.stderr)
        return 2
    return 0


class Unusable(Exception):
    """The bench cannot run here (a part missing); the message says which."""


def measure(args) -> dict:
    """Every chain of args.chains; prints the tables, returns the report (also --json)."""
    from bench import golibcni

    chains = [c.strip() for c in args.chains.split(",") if c.strip()]
    if "real" in chains and not (REAL_PLUGINS / "bridge").exists():
        raise Unusable(f"no CNI plugins in {REAL_PLUGINS} (run .ci/install-deps)")
    libcni = ""
    report: dict = {"pods": args.pods, "warmup": args.warmup, "rounds": args.rounds, "chains": {}}
    if not getattr(args, "no_libcni", False):
        try:
            libcni = golibcni.build()
            report["libcni"] = golibcni.versions()
        except golibcni.NoGo as exc:
            report["libcni_missing"] = str(exc)
            print(f"bench_cni: NO libcni anchor ({exc}): the exec floor only", file=sys.stderr)

    jan = Janitor()
    workdir = Path(tempfile.mkdtemp(prefix="nct-bench-"))
    jan.track_path(workdir)
    ipt_baseline = set(iptables_lines())
    try:
        n = args.warmup + args.pods
        per = 3 if libcni else 2
        namespaces = [jan.netns().path for _ in range(per * n)]
        print(
            f"bench_cni: {per * n} netns ready; python {sys.version.split()[0]}; "
            f"libcni {'from ' + report['libcni'] if libcni else 'left out'}; "
            f"temp dir {workdir} ({_fstype(workdir)})"
        )
        tmpfs: Path | None = None
        noop_bin = ""
        for chain in CHAINS:
            if chain not in chains:
                continue
            if chain.endswith("-tmpfs"):
                if tmpfs is None:
                    tmpfs = Path(tempfile.mkdtemp(prefix="nct-bench-", dir="/dev/shm"))
                    jan.track_path(tmpfs)
                cache = tmpfs / f"cache-{chain}"
            else:
                cache = workdir / f"cache-{chain}"
            where = f"cache on {_fstype(cache.parent)}"
            if chain.startswith("real"):
                subnet = free_subnet(prefixlen=22)
                bridge = unique_name("bb")
                jan.track_link(bridge)
                gw = str(subnet.network_address + 1)
                ipam_dir = workdir / f"ipam-{chain}"
                conflist = {
                    "cniVersion": CNI_VERSION,
                    "name": "nct-bench-real",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": bridge,
                            "isGateway": False,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": str(subnet)}]],
                                "dataDir": str(ipam_dir),
                            },
                        },
                        {
                            "type": "portmap",
                            "capabilities": {"portMappings": True},
                            "snat": False,
                            "backend": "iptables",
                        },
                    ],
                }

                def caps_for(k: int, gw=gw) -> dict:
                    return {
                        "portMappings": [
                            {"hostPort": 20000 + k, "containerPort": 80, "protocol": "tcp", "hostIP": gw}
                        ]
                    }

                times = run_chain(
                    chain,
                    conflist,
                    str(REAL_PLUGINS),
                    namespaces,
                    args.pods * args.rounds,
                    args.warmup,
                    str(cache),
                    caps_for,
                    "K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod",
                    libcni,
                )
                s = summarize(chain, times, None)
                print_table(f"{chain}: bridge + host-local + portmap, {where}", s, args.pods * args.rounds)
                left = host_local_reservations(ipam_dir)
                if left:
                    print(f"bench_cni: WARNING {len(left)} host-local reservations left", file=sys.stderr)
            else:
                if not noop_bin:
                    noop_bin = build_noop(workdir)
                conflist = {
                    "cniVersion": CNI_VERSION,
                    "name": "nct-bench-noop",
                    "plugins": [{"type": "noop1"}, {"type": "noop2"}, {"type": "noop3"}],
                }
                times = run_chain(
                    chain,
                    conflist,
                    noop_bin,
                    namespaces,
                    args.pods * args.rounds,
                    args.warmup,
                    str(cache),
                    lambda k: {},
                    "K8S_POD_NAMESPACE=bench",
                    libcni,
                )
                s = summarize(chain, times, 3)
                print_table(f"{chain}: 3 no-op static C plugins, {where}", s, args.pods * args.rounds)
            report["chains"][chain] = {"summary": s, "times_ms": _raw(times)}

        print()
        for chain in ("real", "real-tmpfs"):
            real = report["chains"].get(chain, {}).get("summary")
            if not real:
                continue
            for verb in ("ADD", "DEL"):
                r = real[verb]["median_paired_ratio"]
                lo, hi = real[verb]["median_paired_ratio_ci95"]
                print(
                    f"{chain} {verb}: median ratio nri-cni/floor {r:.3f} (95% CI {lo:.3f}-{hi:.3f}; "
                    f"goal `cni_floor` {GOALS['cni_floor'].text}: {met('cni_floor', r)})"
                )
        for chain in ("noop", "noop-tmpfs"):
            noop = report["chains"].get(chain, {}).get("summary")
            if not noop:
                continue
            for verb in ("ADD", "DEL"):
                c = noop[verb]["own_ms_per_call"]
                print(
                    f"{chain} {verb}: nri-cni own cost {c:.3f} ms per plugin call "
                    f"(`own_call`, goal {GOALS['own_call'].text}: information)"
                )
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    finally:
        errors = jan.cleanup()
        remove_cni_scaffolding(ipt_baseline)
        if errors:
            print("bench_cni: cleanup errors: " + "; ".join(errors), file=sys.stderr)
            raise RuntimeError("bench_cni: cleanup errors: " + "; ".join(errors))
    return report


def _raw(times: dict) -> dict:
    return {f"{who}_{verb}": v for (who, verb), v in times.items()}


def _fstype(path: Path) -> str:
    try:
        return subprocess.run(
            ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
