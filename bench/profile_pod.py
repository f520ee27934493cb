#!/usr/bin/env python3
"""One pod's timeline: its creation and its stop+remove, on containerd and on CRI-O, nri-cni's
shim against the runtime's own CNI, every step with its start and end on one clock.

bench_pods.py's part 1 (containerd: `native` against `shim`, and `floor`: the shim chained
after containerd's own plugins, answered by a process doing nothing) and bench_crio.py's part 1
(CRI-O: `crio`, `crio-shim`, `crio-floor`), with their instances, their alternation and their
checks; the steps come from witnesses that do not slow what they watch, all on the wall clock:

- the CRI calls' own timing (RunPodSandbox, StopPodSandbox, RemovePodSandbox sent and answered);
- the kernel's process events (profile_crio_stop.ProcEvents): every process the runtime or the
  nri-cni daemon started, directly or below, while the call ran: spawned -> gone (its last
  thread), named by its executable (the shim, each CNI plugin, pinns, runc, the runtime's shim);
- nri-cni's op records (nri_cni/pod/oprecord.py): each operation's start and end (the daemon
  received the shim's request and answered it, the CHECK after ADD on CRI-O);
- the NRI messages: nri-cni (and the floor's null plugin) reach the runtime's NRI socket through
  a tap of this tool (a unix socket that passes the bytes on and stamps them: a request from the
  runtime that names the pod -> the next bytes the plugin sends back). The tap is one more
  socket hop (tens of us) on the NRI path of both.

Per set-up and phase, each step's start and end are taken relative to the CRI call sent, and
the median over the pods is printed side by side (a step seen in fewer pods says in how many).
What no witness shows is not guessed: the gap between two steps names what the code does there
(e.g. between the daemon receiving the ADD and the first plugin spawned: the intent record
written and synced). Needs root, containerd and CRI-O as the benches; cleans up as they do.
Run:  sudo ./.venv/bin/python bench/profile_pod.py [--pods 10] [--runtimes containerd,crio]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import bench_pods  # noqa: E402
from bench.bench_crio import CrioBench  # noqa: E402
from bench.profile_crio_stop import ProcEvents  # noqa: E402
from nri_cni.api import nri_pb2, ttrpc_pb2  # noqa: E402
from nri_cni.nri import mux  # noqa: E402
from nri_cni.ttrpc import framing  # noqa: E402
from tests.support.crio import available as crio_available  # noqa: E402

POD_ID = re.compile(rb"[0-9a-f]{64}")
REQUEST, RESPONSE = 1, 2  # ttrpc message types


def nri_request(body: bytes) -> str:
    """The pod event a ttrpc Request carries: its method, or a StateChange's event by name (as
    containerd 2.1 sends them), e.g. "RunPodSandbox"."""
    req = ttrpc_pb2.Request.FromString(body)
    if req.method != "StateChange":
        return req.method
    event = nri_pb2.StateChangeEvent.FromString(req.payload).event
    return "".join(w.capitalize() for w in nri_pb2.Event.Name(event).split("_"))


class Frames:
    """One direction of the NRI socket: its mux chunks, and in each mux connection its ttrpc
    messages, whole (header: length, stream id, type, flags)."""

    def __init__(self) -> None:
        self.raw = b""
        self.conns: dict[int, bytes] = {}

    def feed(self, chunk: bytes) -> list[tuple[int, int, int, bytes]]:
        """The whole messages `chunk` completes: (mux conn, stream id, type, body)."""
        self.raw += chunk
        out = []
        while len(self.raw) >= mux.HEADER_SIZE:
            conn, length = mux.HEADER.unpack_from(self.raw)
            if len(self.raw) < mux.HEADER_SIZE + length:
                break
            data = self.conns.get(conn, b"") + self.raw[mux.HEADER_SIZE : mux.HEADER_SIZE + length]
            self.raw = self.raw[mux.HEADER_SIZE + length :]
            while len(data) >= framing.HEADER_SIZE:
                size, stream, kind, _flags = framing.HEADER.unpack_from(data)
                if len(data) < framing.HEADER_SIZE + size:
                    break
                out.append((conn, stream, kind, data[framing.HEADER_SIZE : framing.HEADER_SIZE + size]))
                data = data[framing.HEADER_SIZE + size :]
            self.conns[conn] = data
        return out


class NriTap:
    """A unix socket in front of the runtime's NRI socket: every connection is passed on; each
    request of the runtime's that names a pod is stamped when it passed, and so is nri-cni's
    response of the same mux connection and ttrpc stream."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream, self.path = upstream, path
        self.events: list[tuple[float, float, str, set[str]]] = []  # (sent, answered, method, pods)
        self._open: dict[tuple[int, int, int], tuple[float, str, set[str]]] = {}
        self._lock = threading.Lock()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        n = 0
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:
                return  # closed
            n += 1
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.upstream)
            except OSError:  # the runtime stopped first (the end of a set-up): the plugin's reconnect
                up.close()
                down.close()
                continue
            threading.Thread(target=self._pump, args=(up, down, n, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(down, up, n, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: int, from_runtime: bool) -> None:
        frames = Frames()
        with contextlib.suppress(OSError):
            while chunk := src.recv(1 << 16):
                now = time.time()
                dst.sendall(chunk)
                for conn, stream, kind, body in frames.feed(chunk):
                    self._seen(now, (link, conn, stream), kind, body, from_runtime)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _seen(
        self, now: float, key: tuple[int, int, int], kind: int, body: bytes, from_runtime: bool
    ) -> None:
        with self._lock:
            if from_runtime and kind == REQUEST:
                pods = {p.decode() for p in POD_ID.findall(body)}
                if pods:
                    with contextlib.suppress(Exception):  # not a request of NRI's: not a pod event
                        self._open[key] = (now, nri_request(body), pods)
            elif not from_runtime and kind == RESPONSE and key in self._open:
                sent, method, pods = self._open.pop(key)
                self.events.append((sent, now, method, pods))

    def close(self) -> None:
        self.server.close()


class Timeline:
    """Over a Bench (bench_pods) or a CrioBench: the wall clock for the CRI calls' stamps,
    the process events, an NRI tap in front of every nri-cni daemon; each measured pod's
    steps kept per (set-up, phase)."""

    procs: ProcEvents
    steps: dict[tuple[str, str], dict[str, list[tuple[float, float]]]]

    clock = staticmethod(time.time)

    def nri_path(self, setup, nri_socket: str) -> str:
        path = str(setup.sock_dir / "nri-tap.sock")
        tap = NriTap(nri_socket, path)
        self.stack.callback(tap.close)
        self.taps.append(tap)
        return path

    def nri_cni(self, daemons, setup, cfg):
        cfg["nri"]["socket"] = self.nri_path(setup, cfg["nri"]["socket"])
        return super().nri_cni(daemons, setup, cfg)

    def ran(self, mode, pod, t0, t1) -> None:
        self.calls.append((mode, pod, "creation", {"CRI RunPodSandbox": (t0, t1)}))

    def stopped(self, mode, pod, t0, t1, t2) -> None:
        calls = {"CRI StopPodSandbox": (t0, t1), "CRI RemovePodSandbox": (t1, t2)}
        self.calls.append((mode, pod, "stop+remove", calls))

    def run(self, modes) -> None:
        self.procs = ProcEvents()
        self.calls: list = []
        super().run(modes)
        time.sleep(0.2)  # the last events reach the listener's thread
        for mode, pod, phase, calls in self.calls:
            row = pod_steps(mode, pod, calls, self.procs, self.taps, self.ops(mode))
            for step, span in row.items():
                self.steps.setdefault((mode.name, phase), {}).setdefault(step, []).append(span)

    def ops(self, mode) -> list[dict]:
        if mode.daemon is None:
            return []
        if mode.name not in self._ops:
            self._ops[mode.name] = [op for op in mode.daemon.op_lines() if op["podId"] in mode.measured_pods]
        return self._ops[mode.name]


class ContainerdTimeline(Timeline, bench_pods.Bench):
    pass


class CrioTimeline(Timeline, CrioBench):
    pass


def _below(procs: ProcEvents, pid: int, roots: set[int]) -> bool:
    seen = 0
    while pid and seen < 64:
        if pid in roots:
            return True
        pid, seen = procs.parent.get(pid, 0), seen + 1
    return False


def pod_steps(mode, pod: str, calls: dict, procs: ProcEvents, taps: list[NriTap], ops: list[dict]) -> dict:
    """One pod's steps in one phase: {step: (start, end)} in ms from the first CRI call sent."""
    t0 = min(a for a, _ in calls.values())
    t1 = max(b for _, b in calls.values())
    out: dict[str, tuple[float, float]] = {}

    def add(step: str, start: float, end: float) -> None:
        n, name = 1, step
        while name in out:
            n += 1
            name = f"{step} #{n}"
        out[name] = ((start - t0) * 1000, (end - t0) * 1000)

    for step, (a, b) in calls.items():
        add(step, a, b)
    roots = {mode.ctd.proc.pid} | ({mode.daemon.proc.pid} if mode.daemon is not None else set())
    forked = list(procs.forked.items())  # the listener's thread goes on adding (other jobs' processes)
    kids = [p for p, at in forked if t0 <= at <= t1 and _below(procs, p, roots)]
    unnamed = []
    for p in sorted(kids, key=lambda p: procs.forked[p]):
        name = procs.exe.get(p, (0.0, "?"))[1]
        if name in ("?", ""):  # gone before its name was read, or a deleted file (runc's memfd)
            unnamed.append((procs.forked[p], procs.gone(p) or t1))
            continue
        name += f" {procs.cni_command[p]}" if p in procs.cni_command else ""
        gone = procs.gone(p)
        if p in procs.exe and name.startswith("nri-cni"):  # the shim's exec: the CNI exec of the shim
            add(f"process {name}: spawned -> exec'd", procs.forked[p], procs.exe[p][0])
        add(f"process {name}: spawned -> gone", procs.forked[p], gone if gone else t1)
    if unnamed:
        add(
            "processes not named in time: first spawned -> last gone",
            min(a for a, _ in unnamed),
            max(b for _, b in unnamed),
        )
    for op in ops:
        if op["podId"] == pod and t0 <= op["start"] <= t1:
            what = op["op"].upper() + (f" (from {op['from']})" if op.get("from") else "")
            add(f"nri-cni: {what}, op record start -> end", op["start"], op["end"])
            for name, at in (op.get("marks") or {}).items():  # the instants it names inside
                add(f"nri-cni: {what}, {name}", op["start"] + at / 1000, op["start"] + at / 1000)
    for tap in taps:
        for sent, answered, method, pods in tap.events:
            if pod in pods and t0 <= sent <= t1:
                add(f"NRI {method}: sent -> answered", sent, answered)
    return out


def medians(spans: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(a for a, _ in spans), statistics.median(b for _, b in spans)


def side_by_side(steps: dict, sides: tuple[str, ...], phase: str, pods: int) -> str:
    """The median timeline of the set-ups in one phase, as a markdown table."""
    columns = [steps.get((s, phase), {}) for s in sides]
    names = set().union(*columns)

    def first(step: str) -> float:
        return min(medians(s[step])[0] for s in columns if step in s)

    def cell(side: dict, step: str) -> str:
        if step not in side:
            return "-"
        s, e = medians(side[step])
        n = len(side[step])
        return f"{s:.2f} - {e:.2f} ({e - s:.2f})" + ("" if n >= pods else f" [{n} of {pods}]")

    lines = [
        f"| {phase}: step (ms from the CRI call sent) | " + " | ".join(sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    lines += ["| " + " | ".join([n, *(cell(c, n) for c in columns)]) + " |" for n in sorted(names, key=first)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=10, help="measured pods per set-up (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured pods first (default 2)")
    ap.add_argument("--runtimes", default="containerd,crio", help="containerd, crio or both")
    ap.add_argument("--json", metavar="FILE", help="also write every pod's steps here")
    args = ap.parse_args(argv)
    args.host_ports = False
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if os.geteuid() != 0 or ("crio" in runtimes and not crio_available()):
        print("profile_pod: needs root, and CRI-O for crio (.ci/install-deps)", file=sys.stderr)
        return 2
    from tests.support.machine import machine_turn

    before = os.popen("uptime").read().strip()
    tables, dump, problems = [], {}, []
    for runtime in runtimes:
        kind, sides = (
            (ContainerdTimeline, ("native", "shim", "floor"))
            if runtime == "containerd"
            else (CrioTimeline, ("crio", "crio-shim", "crio-floor"))
        )
        with machine_turn(f"profile_pod {runtime}"), contextlib.ExitStack() as stack:
            bench = kind(args, stack)
            bench.taps, bench.steps, bench._ops = [], {}, {}
            try:
                bench.part_shim()
            finally:
                problems += bench.problems
        for phase in ("creation", "stop+remove"):
            tables.append(
                f"{runtime}, {phase}, medians of {args.pods} pods:\n\n"
                + side_by_side(bench.steps, sides, phase, args.pods)
            )
        dump[runtime] = {f"{s}/{p}": v for (s, p), v in bench.steps.items()}
    after = os.popen("uptime").read().strip()
    print(
        f"\nprofile_pod --pods {args.pods} --runtimes {','.join(runtimes)}: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n`uptime` before: `{before}`; after: `{after}`\n"
    )
    print("\n\n".join(tables))
    if args.json:
        Path(args.json).write_text(json.dumps(dump, indent=1))
    if problems:
        print("profile_pod: cleanup problems:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
