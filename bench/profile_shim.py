#!/usr/bin/env python3
"""The shim path's own milliseconds: one daemon (`nri-cni run`, mode shim) and the compiled
`nri-cni-shim`, exec'd here as a runtime would, on the no-op chain (three static C plugins,
bench_cni.py's), so what is left is nri-cni's part and the shim's.

Per ADD the steps between these instants, medians over --pods ADDs (each followed by its DEL):

  spawned     this driver starts the shim (time.time(): the daemon's log line has the same clock)
  accepted    the local server's connection callback runs (op record mark, nri_cni/pod/oprecord.py)
  read        the whole request read
  decoded     its JSON parsed, the pod taken from the CNI environment
  start       the pod operation begins (its network selection done, the pod's lock held)
  intent written, the chain's ADD begins and ends (the network's step), intent synced,
  finalized, filled (the result's netlink fill), intent cleared
  end         the op record emitted
  exited      the shim's exit seen here

The netns is one the tool makes (the no-op plugins never enter it; the netlink fill does).
Holds the machine's lock (tests/support/machine.py) while it runs. Needs root (a netns). Run:  sudo ./.venv/bin/python bench/profile_shim.py [--pods 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from bench.bench_cni import build_noop  # noqa: E402
from bench.native_node import NativeNode  # noqa: E402
from nri_cni.shim import compile_shim  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402
from tests.support.machine import machine_turn  # noqa: E402
from tests.support.names import unique_name  # noqa: E402

STEPS = (
    "spawned",
    "accepted",
    "read",
    "decoded",
    "start",
    "intent written",
    "add begins",
    "add ends",
    "intent synced",
    "finalized",
    "filled",
    "intent cleared",
    "end",
    "exited",
)


def shim_call(shim: str, command: str, cid: str, netns: str, stdin: bytes) -> tuple[float, float, bytes]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p-{cid[:8]}",
        "CNI_PATH": os.path.dirname(shim),
    }
    spawned = time.time()
    proc = subprocess.run([shim], input=stdin, env=env, capture_output=True)
    exited = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"shim {command} failed: {proc.stdout!r} {proc.stderr!r}")
    return spawned, exited, proc.stdout


def instants(line: dict, spawned: float, exited: float) -> dict[str, float]:
    """ms from the op's start of each named instant of one ADD."""
    marks = line.get("marks", {})
    add = next(n for n in line["networks"] if n["op"] == "add")
    out = {
        "spawned": (spawned - line["start"]) * 1000,
        "start": 0.0,
        "add begins": add["at"],
        "add ends": add["at"] + add["ms"],
        "end": line["ms"],
        "exited": (exited - line["start"]) * 1000,
    }
    out.update({k: v for k, v in marks.items() if k in STEPS})
    return out


async def measure(pods: int, warmup: int) -> dict[str, list[float]]:
    jan = Janitor()
    work = Path(tempfile.mkdtemp(prefix="nct-profshim-", dir="/dev/shm"))
    netns_name = unique_name("ps")
    await asyncio.to_thread(subprocess.run, ["ip", "netns", "add", netns_name], check=True)
    netns = f"/var/run/netns/{netns_name}"
    node = NativeNode(jan, [], mode="shim")
    try:
        node.bin_dirs = [build_noop(work)]
        shim = str(work / "shim-bin" / "nri-cni-shim")
        os.makedirs(os.path.dirname(shim))
        compile_shim(shim, str(node.sock_dir / "d.sock"))
        conflist = {
            "cniVersion": "1.1.0",
            "name": "nct-prof-noop",
            "plugins": [{"type": "noop1"}, {"type": "noop2"}, {"type": "noop3"}],
        }
        await node.start(conflist)
        stdin = json.dumps({"cniVersion": "1.0.0", "name": "nri-cni", "type": "nri-cni-shim"}).encode()
        calls: dict[str, tuple[float, float]] = {}
        for i in range(warmup + pods):
            cid = uuid.uuid4().hex * 2
            spawned, exited, _out = await asyncio.to_thread(shim_call, shim, "ADD", cid, netns, stdin)
            if i >= warmup:
                calls[cid] = (spawned, exited)
            await asyncio.to_thread(shim_call, shim, "DEL", cid, netns, stdin)
        lines = {
            line["podId"]: line
            for line in node.daemon.op_lines()
            if line["op"] == "add" and line["podId"] in calls
        }
        if len(lines) != len(calls):
            raise RuntimeError(f"{len(calls) - len(lines)} ADD(s) without an op record")
        series: dict[str, list[float]] = {s: [] for s in STEPS}
        for cid, (spawned, exited) in calls.items():
            for step, at in instants(lines[cid], spawned, exited).items():
                series[step].append(at)
        return series
    finally:
        await node.drain()
        node.cleanup()
        await asyncio.to_thread(subprocess.run, ["ip", "netns", "del", netns_name], check=False)
        shutil.rmtree(work, ignore_errors=True)
        jan.cleanup_or_raise()


def print_timeline(series: dict[str, list[float]]) -> None:
    medians = {s: statistics.median(v) for s, v in series.items() if v}
    prev = None
    print(f"{'instant':<16}{'ms from start':>14}{'step (median)':>15}")
    for step in sorted(medians, key=medians.__getitem__):  # the intent's sync ends where it ends
        gaps = [b - a for a, b in zip(series[prev], series[step])] if prev else []
        gap = f"{statistics.median(gaps):.3f}" if gaps else ""
        print(f"{step:<16}{medians[step]:>14.3f}{gap:>15}")
        prev = step
    print(
        f"spawned -> exited (median): {statistics.median(b - a for a, b in zip(series['spawned'], series['exited'])):.3f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", help="write each step's series here")
    args = ap.parse_args(argv)
    with machine_turn("profile_shim"):  # its cleanup touches the node's shared CNI iptables chains
        series = asyncio.run(measure(args.pods, args.warmup))
    print_timeline(series)
    if args.json:
        Path(args.json).write_text(json.dumps(series))
    return 0


if __name__ == "__main__":
    sys.exit(main())
