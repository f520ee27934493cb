#!/usr/bin/env python3
"""Container creation with and without nri-cni's CreateContainer adjustment (docs/containers.md).

Two containerd 2.1.9 instances side by side, each with its nri-cni daemon in shim mode and the
same bridge network:

  adjusted  `containers:` as shipped: the network-status annotation, the per-key metadata
            annotations and the status file (written, its directory bind-mounted read-only);
            with --adjusted annotations or file, that part alone
     vs
  plain     `containers: {annotations: false, file: false, sockets: false}`: CreateContainer is
            still answered, with nothing in it

A few pods per instance, made once; then busybox containers (tests/support/busybox.py) are
created and started in them, one at a time, ALTERNATED container by container (the order rotates
each round), so that a shared, noisy machine's drift hits both alike. Measured per container:
CreateContainer + StartContainer as kubelet sees them. Each container of `adjusted` is checked
outside the timing (its OCI spec has the annotation, unless its annotations are off), each of
`plain` has none; then it is stopped and removed, untimed.

Output: per side median and p90 (ms), the median ratio adjusted/plain (goal `containers`,
bench/goals.py), and where adjusted's extra time goes: CreateContainer and StartContainer apart
(medians), and in the create nri-cni's own answers to NRI CreateContainer (the mean of each
daemon's `nri_cni_nri_request_duration_seconds{method="CreateContainer"}` over the measured
containers, read from its metrics socket after the warm-up and at the end).
Run:  ./.venv/bin/python bench/bench_containers.py [--containers 40] [--pods 4] [--adjusted all]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_crio import scrape_metrics  # noqa: E402
from bench.bench_pods import NAMESPACE, Bench, Interrupted, _on_sigterm, _summary  # noqa: E402
from bench.goals import GOALS  # noqa: E402
from tests.support.busybox import BUSYBOX, build_busybox_image  # noqa: E402
from tests.support.machine import machine_turn  # noqa: E402

SUBNETS = {"adjusted": "10.246.170.0/24", "plain": "10.246.171.0/24"}
OFF = {"annotations": False, "file": False, "sockets": False}
# what the adjusted side gets (--adjusted): as shipped, or one part alone (the runtime's cost of
# each: the annotations in the OCI spec, the status directory's bind mount)
ADJUSTED = {
    "all": {},
    "annotations": {"file": False, "sockets": False},
    "file": {"annotations": False, "sockets": False},
}
ANNOTATION = "k8s.v1.cni.cncf.io/network-status"


@dataclass
class Side:
    name: str
    ctd: object
    pods: list[tuple[str, object]] = field(default_factory=list)  # (pod id, its sandbox config)
    ms: list[float] = field(default_factory=list)  # CreateContainer + StartContainer
    create_ms: list[float] = field(default_factory=list)  # CreateContainer alone
    metrics: str = ""  # the daemon's metrics socket
    nri_mean_ms: float | None = None  # nri-cni's CreateContainer answers, measured containers


def _setup(bench: Bench, image, name: str, containers: dict) -> Side:
    daemons = bench.daemons()
    net = bench.bridge_net_named(name)
    setup = bench.shim_setup(name)
    ctd = bench.containerd(name, setup.conf_dir, [setup.bin_dir])
    ctd.import_image(image.archive)
    ctd._wait_image(image.ref)
    cfg = setup.config(ctd.nri_socket, [{"name": net.name, "default": True, "conflist": net.conflist}])
    cfg["containers"] = containers
    metrics = str(setup.sock_dir / "metrics.sock")
    cfg["metrics"] = {"listen": metrics}
    bench.nri_cni(daemons, setup, cfg)
    return Side(name, ctd, metrics=metrics)


def measure(args) -> dict:
    image = build_busybox_image()
    with contextlib.ExitStack() as stack:
        bench = ContainerBench(args, stack)
        adjusted = ADJUSTED[args.adjusted]
        sides = [_setup(bench, image, "adjusted", adjusted), _setup(bench, image, "plain", OFF)]
        for side in sides:
            for i in range(args.pods):
                name, uid = f"{side.name}-{i}-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
                pod = side.ctd.cri.run_pod(name, NAMESPACE, uid)
                side.pods.append((pod, side.ctd.cri.pod_config(name, NAMESPACE, uid)))
        print(
            f"containers: adjusted vs plain, {args.containers} each (+{args.warmup} warm-up) in "
            f"{args.pods} pods, alternated",
            flush=True,
        )
        answered: dict[str, tuple[float, float]] = {}  # side -> (sum s, count) after the warm-up
        for i in range(args.warmup + args.containers):
            if i == args.warmup:
                answered = {s.name: _answers(scrape_metrics(s.metrics)) for s in sides}
            k = i % len(sides)
            for side in sides[k:] + sides[:k]:
                pod, sandbox = side.pods[i % len(side.pods)]
                t0 = time.perf_counter()
                cid = side.ctd.cri.create_container(
                    pod, sandbox, f"c{i}", image.ref, [BUSYBOX, "sleep", "1000"]
                )
                t1 = time.perf_counter()
                side.ctd.cri.start_container(cid)
                took = (time.perf_counter() - t0) * 1000
                _state, info = side.ctd.cri.container_status(cid)
                has = ANNOTATION in info["info"]["runtimeSpec"].get("annotations", {})
                if has != (side.name == "adjusted" and adjusted.get("annotations", True)):
                    raise RuntimeError(f"{side.name}: container {cid[:12]} annotation present: {has}")
                side.ctd.cri.stop_container(cid)
                side.ctd.cri.remove_container(cid)
                if i >= args.warmup:
                    side.ms.append(took)
                    side.create_ms.append((t1 - t0) * 1000)
        for side in sides:
            total, count = _answers(scrape_metrics(side.metrics))
            before = answered.get(side.name, (0.0, 0.0))
            side.nri_mean_ms = (total - before[0]) / (count - before[1]) * 1000 if count > before[1] else None
        for side in sides:
            for pod, _ in side.pods:
                side.ctd.cri.stop_pod(pod)
                side.ctd.cri.remove_pod(pod)
        out = {s.name: _summary(s.ms) for s in sides}
        for s in sides:
            out[s.name]["create_median"] = round(statistics.median(s.create_ms), 2)
            out[s.name]["start_median"] = round(
                statistics.median(b - a for a, b in zip(s.create_ms, s.ms, strict=True)), 2
            )
            out[s.name]["nri_create_mean"] = None if s.nri_mean_ms is None else round(s.nri_mean_ms, 3)
        out["ratio"] = round(out["adjusted"]["median"] / out["plain"]["median"], 3)
        out["per_round_ratio_median"] = round(
            statistics.median(a / p for a, p in zip(sides[0].ms, sides[1].ms, strict=True)), 3
        )
        out["raw"] = {s.name: [round(x, 2) for x in s.ms] for s in sides}
        out["raw_create"] = {s.name: [round(x, 2) for x in s.create_ms] for s in sides}
        out["split"] = split(out)
        print(f"  {describe_split(out['split'])}", flush=True)
        problems = bench.problems
    if problems:
        raise RuntimeError(f"cleanup: {problems}")
    return out


def _answers(metrics: str) -> tuple[float, float]:
    """(sum in s, count) of nri-cni's answers to NRI CreateContainer, from its metrics text."""
    found = []
    for part in ("sum", "count"):
        m = re.search(
            rf'^nri_cni_nri_request_duration_seconds_{part}{{method="CreateContainer"}} (\S+)$', metrics, re.M
        )
        found.append(float(m.group(1)) if m else 0.0)
    return found[0], found[1]


def split(out: dict) -> dict:
    """Where adjusted's time over plain goes (ms): the CRI CreateContainer and StartContainer
    (medians), and in the create nri-cni's own answer to NRI CreateContainer (means, as the
    daemon measured them) and the rest, containerd's."""
    adj, plain = out["adjusted"], out["plain"]
    create = round(adj["create_median"] - plain["create_median"], 2)
    nri = None
    if adj["nri_create_mean"] is not None and plain["nri_create_mean"] is not None:
        nri = round(adj["nri_create_mean"] - plain["nri_create_mean"], 3)
    return {
        "total_diff_ms": round(adj["median"] - plain["median"], 2),
        "create_diff_ms": create,
        "start_diff_ms": round(adj["start_median"] - plain["start_median"], 2),
        "nri_adjusted_ms": adj["nri_create_mean"],
        "nri_plain_ms": plain["nri_create_mean"],
        "nri_diff_ms": nri,
        "create_runtime_diff_ms": None if nri is None else round(create - nri, 2),
    }


def describe_split(split: dict) -> str:
    """The split as one sentence (the bench's "why" line for the containers row)."""

    def ms(key: str, fmt: str = ".2f") -> str:
        value = split.get(key)
        return "?" if value is None else format(value, fmt)

    return (
        f"adjusted {split['total_diff_ms']:+.1f} ms over plain (medians): CreateContainer "
        f"{split['create_diff_ms']:+.1f} ms, of which nri-cni's answer to NRI CreateContainer "
        f"{ms('nri_diff_ms', '+.2f')} ms ({ms('nri_adjusted_ms')} vs {ms('nri_plain_ms')} ms, means as "
        f"nri-cni measured them) and containerd's side {ms('create_runtime_diff_ms', '+.1f')} ms (the NRI "
        f"round trip, the adjustment merged into the OCI spec); StartContainer {split['start_diff_ms']:+.1f} ms "
        "(runc's create and start of the task, where the status directory is bind-mounted)"
    )


class ContainerBench(Bench):
    def bridge_net_named(self, side: str):
        from tests.support.hostnet import BridgeNetwork
        from tests.support.names import unique_name

        d = self.tmp / f"net-{side}"
        d.mkdir()
        net = BridgeNetwork(
            d, bridge=unique_name("bc"), subnet=SUBNETS[side], name=f"nct-bench-{side}-{os.getpid()}"
        )
        self.stack.callback(lambda: self.problems.extend(net.cleanup()))
        return net


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--containers", type=int, default=40, help="measured containers per side (default 40)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured containers first (default 3)")
    ap.add_argument("--pods", type=int, default=4, help="pods per side the containers go to (default 4)")
    ap.add_argument(
        "--adjusted",
        choices=sorted(ADJUSTED),
        default="all",
        help="what the adjusted side gets: all (as shipped, the default), the annotations or the file alone",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the raw times and summary here")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with machine_turn("bench_containers"):  # no integration test or bench beside it
            out = measure(args)
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    for name in ("adjusted", "plain"):
        s = out[name]
        print(f"  {name:9} median {s['median']:.1f} ms  p90 {s['p90']:.1f} ms")
    print(
        f"  adjusted/plain median ratio {out['ratio']:.3f} (goal `containers` {GOALS['containers'].text}); per-round {out['per_round_ratio_median']:.3f}"
    )
    print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
