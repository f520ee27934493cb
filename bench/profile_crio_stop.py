#!/usr/bin/env python3
"""Where a pod's StopPodSandbox goes on CRI-O 1.36: shim mode against CRI-O's own CNI, step by step.

bench_crio.py's part 1 (the same two CRI-O instances, the same alternation; CRI-O at log level
debug on both sides), with two witnesses that do not slow what they watch:

- the kernel's process events (the proc connector, NETLINK_CONNECTOR): when each process was
  forked, exec'd and exited (its main thread, and the last of its threads: the moment its
  parent can reap it), with the kernel's clock;
- CRI-O's debug log (when the StopPodSandbox request came, when its CNI DEL was over: the
  "Using stop timeout" line that follows it) and nri-cni's op lines (its DEL's start and end).

Per pod, the stop's CNI DEL is cut where one of them saw something: CRI-O's request -> the first
process it spawns (a plugin, or the shim) -> [shim: exec'd -> nri-cni's DEL begins -> the first
plugin spawned] -> each plugin spawned -> exited -> the next -> the last exited -> [nri-cni's DEL
ends -> the shim exits] -> CRI-O goes on. Printed: the median of each step on each side, the
CNI DEL as CRI-O saw it, what is left of StopPodSandbox (unmount, netns unpin, NRI STOP), the
RemovePodSandbox, and bench_crio's split line (nri-cni's NRI answers from its metrics).
Needs root and CRI-O (as bench_crio.py). Cleans up as bench_crio.py does.
Run:  sudo ./.venv/bin/python bench/profile_crio_stop.py [--pods 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import struct
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import bench_pods  # noqa: E402
from bench.bench_crio import CrioBench  # noqa: E402
from tests.support.crio import available  # noqa: E402

NETLINK_CONNECTOR, CN_IDX_PROC, PROC_CN_MCAST_LISTEN = 11, 1, 1
FORK, EXEC, EXIT = 0x1, 0x2, 0x80000000
STOP_REQUEST = re.compile(r'StopPodSandboxRequest: pod_sandbox_id:\\"([0-9a-f]{64})')
REQUEST_ID = re.compile(r" id=([0-9a-f-]{36}) ")
CNI_COMMAND = re.compile(rb"(?:^|\0)CNI_COMMAND=([A-Z]+)")


class ProcEvents:
    """Every fork (of a process, not a thread), exec and exit on the machine while it listens."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, CN_IDX_PROC))
        body = struct.pack("=IIIIHHI", CN_IDX_PROC, 1, 0, 0, 4, 0, PROC_CN_MCAST_LISTEN)
        self.sock.send(struct.pack("=IHHII", 16 + len(body), 3, 0, 0, os.getpid()) + body)
        self.wall_offset = time.time() - time.monotonic()  # the events' clock is CLOCK_MONOTONIC
        self.parent: dict[int, int] = {}
        self.forked: dict[int, float] = {}
        self.exe: dict[int, tuple[float, str]] = {}
        self.cni_command: dict[int, str] = {}  # a CNI plugin's CNI_COMMAND (ADD, CHECK, DEL)
        self.leader_exit: dict[int, float] = {}
        self.last_exit: dict[int, float] = {}  # the last thread of the process
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        while True:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                (length,) = struct.unpack_from("=I", data, off)
                ev = data[off + 36 : off + length]  # past nlmsghdr (16) and cn_msg (20)
                off += (length + 3) & ~3
                if len(ev) < 24:
                    continue
                what, _cpu, ns = struct.unpack_from("=IIQ", ev)
                at = ns / 1e9 + self.wall_offset
                if what == FORK:
                    _ppid, ptgid, pid, tgid = struct.unpack_from("=IIII", ev, 16)
                    if pid == tgid:
                        self.parent[tgid], self.forked[tgid] = ptgid, at
                elif what == EXEC:
                    _pid, tgid = struct.unpack_from("=II", ev, 16)
                    name = "?"  # gone before it was read
                    with contextlib.suppress(OSError):
                        name = os.path.basename(os.readlink(f"/proc/{tgid}/exe"))
                        verb = CNI_COMMAND.search(Path(f"/proc/{tgid}/environ").read_bytes())
                        if verb:
                            self.cni_command[tgid] = verb.group(1).decode()
                    self.exe[tgid] = (at, name)
                elif what == EXIT:
                    pid, tgid = struct.unpack_from("=II", ev, 16)
                    if pid == tgid:
                        self.leader_exit[tgid] = at
                    self.last_exit[tgid] = max(self.last_exit.get(tgid, 0.0), at)

    def children(self, parent: int, start: float, end: float) -> list[int]:
        """The processes `parent` forked that exec'd between start and end, in exec order."""
        kids = [
            p for p, pp in self.parent.items() if pp == parent and start <= self.exe.get(p, (0, ""))[0] <= end
        ]
        return sorted(kids, key=lambda p: self.exe[p][0])

    def gone(self, pid: int) -> float:
        """When the parent could reap it: its last thread's exit."""
        return max(self.leader_exit.get(pid, 0.0), self.last_exit.get(pid, 0.0))


def _crio_time(line: str) -> float:
    stamp = line.split('"', 2)[1].rstrip("Z")  # time="2026-11-26T22:32:20.769763104Z"
    base, _, frac = stamp.partition(".")
    when = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return when.timestamp() + float("0." + (frac or "0"))


def crio_del_spans(log: str) -> dict[str, tuple[float, float]]:
    """Per pod id: (StopPodSandbox request, its CNI DEL over), from CRI-O's debug log."""
    pods: dict[str, str] = {}
    out: dict[str, tuple[float, float]] = {}
    for line in log.splitlines():
        rid = REQUEST_ID.search(line)
        if not line.startswith("time=") or not rid:
            continue
        m = STOP_REQUEST.search(line)
        if m:
            pods[rid.group(1)] = m.group(1)
            out[m.group(1)] = (_crio_time(line), 0.0)
        elif "Using stop timeout" in line and rid.group(1) in pods:
            pod = pods.pop(rid.group(1))
            out[pod] = (out[pod][0], _crio_time(line))
    return out


class StopProfile(CrioBench):
    procs: ProcEvents
    steps: dict[str, dict[str, list[float]]]

    def crio(self, name, conf_dir, bin_dirs, **kw):
        return super().crio(name, conf_dir, bin_dirs, log_level="debug", **kw)

    clock = staticmethod(time.time)  # lined up with the kernel's and CRI-O's stamps

    def stopped(self, mode: bench_pods.Mode, pod: str, t0: float, t1: float, t2: float) -> None:
        self.stops.append((mode, pod, t0, t1, t2))

    def run(self, modes: list[bench_pods.Mode]) -> None:
        """bench_pods' alternation, every measured stop kept with its wall-clock stamps."""
        self.procs = ProcEvents()
        self.stops: list[tuple[bench_pods.Mode, str, float, float, float]] = []
        super().run(modes)
        time.sleep(0.2)  # the last events
        self.steps = self.split(self.stops)

    def split(self, stops) -> dict[str, dict[str, list[float]]]:
        modes = list({s[0].name: s[0] for s in stops}.values())
        spans = {m.name: crio_del_spans(m.ctd.log_path.read_text(errors="replace")) for m in modes}
        dels = {}
        for m in modes:
            if m.daemon is not None:
                dels.update({op["podId"]: op for op in m.daemon.op_lines() if op["op"] == "del"})
        steps: dict[str, dict[str, list[float]]] = {}
        ev = self.procs
        for m, pod, t0, t1, t2 in stops:
            req, over = spans[m.name].get(pod, (0.0, 0.0))
            first = ev.children(m.ctd.proc.pid, req, over)[:1] if over else []
            if not first:
                continue
            row: dict[str, float] = {
                "CRI-O: StopPodSandbox request -> 1st process spawned": ev.forked[first[0]] - req
            }
            if m.daemon is None:
                plugins, last = (
                    ev.children(m.ctd.proc.pid, req, over),
                    "CRI-O: last plugin gone -> CRI-O goes on",
                )
            else:
                shim, op = first[0], dels.get(pod)
                if op is None:
                    continue
                plugins = ev.children(m.daemon.proc.pid, op["start"], op["end"])
                if not plugins or shim not in ev.exe:
                    continue  # a process the listener missed (its buffer overran): no split
                row["the shim: spawned -> exec'd"] = ev.exe[shim][0] - ev.forked[shim]
                row["the shim: exec'd -> nri-cni's DEL begins"] = op["start"] - ev.exe[shim][0]
                row["nri-cni: DEL begins -> 1st plugin spawned"] = ev.forked[plugins[0]] - op["start"]
                row["nri-cni: last plugin gone -> its DEL ends"] = op["end"] - ev.gone(plugins[-1])
                row["nri-cni's DEL ends -> the shim exits"] = ev.gone(shim) - op["end"]
                last = "the shim gone -> CRI-O goes on"
                plugins.append(shim)
            for p in plugins[:-1] if m.daemon is not None else plugins:
                row[f"plugin {ev.exe[p][1]}: spawned -> gone"] = ev.gone(p) - ev.forked[p]
            for a, b in zip(plugins, plugins[1:]):
                if m.daemon is None or b != plugins[-1]:
                    row["between two plugins"] = ev.forked[b] - ev.gone(a)
            row[last] = over - ev.gone(plugins[-1])
            row["= CNI DEL as CRI-O saw it"] = over - req
            row["rest of StopPodSandbox (unmount, netns unpin, NRI STOP)"] = t1 - t0 - (over - req)
            row["RemovePodSandbox"] = t2 - t1
            for k, v in row.items():
                steps.setdefault(k, {}).setdefault(m.name, []).append(v * 1000)
        return steps


_ORDER = (
    "CRI-O: StopPodSandbox",
    "the shim: spawned",
    "the shim: exec'd",
    "nri-cni: DEL begins",
    "plugin portmap",
    "between",
    "plugin ",
    "nri-cni: last plugin",
    "nri-cni's DEL ends",
    "the shim gone",
    "CRI-O: last plugin",
    "= ",
    "rest ",
    "Remove",
)


def _rank(step: str) -> int:
    """The steps in the order they happen (the plugins in the order the DEL runs them)."""
    return next((i for i, prefix in enumerate(_ORDER) if step.startswith(prefix)), len(_ORDER))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=30, help="measured pods per mode (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured pods first (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write each step's values here")
    args = ap.parse_args(argv)
    args.host_ports = False
    if os.geteuid() != 0 or not available():
        print("profile_crio_stop: needs root and CRI-O (.ci/install-deps)", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        bench = StopProfile(args, stack)
        try:
            bench.part_shim()
        finally:
            problems = bench.problems
    if problems:
        print("profile_crio_stop: cleanup problems:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"\nthe stop's CNI DEL step by step, medians over {args.pods} pods (ms; '-': no such step)")
    print(f"  {'step':<58} {'crio':>7} {'crio-shim':>10}")
    for step, sides in sorted(bench.steps.items(), key=lambda kv: _rank(kv[0])):
        cells = [f"{statistics.median(sides[m]):.2f}" if m in sides else "-" for m in ("crio", "crio-shim")]
        print(f"  {step:<58} {cells[0]:>7} {cells[1]:>10}")
    if args.json:
        Path(args.json).write_text(json.dumps(bench.steps, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
