"""What the metrics cost a pod operation: `Metrics.observe_operation` (called once when each pod
operation ends, on the pod's path) and a scrape's `render()`.

    .venv/bin/python bench/bench_metrics.py                       # prometheus_client exposition
    .venv/bin/python bench/bench_metrics.py --baseline OLD.py     # side by side with another
                                                                  # metrics.py (e.g. git show
                                                                  # 766cdcd:nri_cni/metrics.py)

Prints microseconds per call (median of the rounds) and, with --baseline, the ratio. An
operation here is what the pod plan reports for a pod with three networks: three ADDs and
three FINALIZEs (six histogram observations), one counter. Compare with a pod ADD itself: tens
of milliseconds (bench_cni.py), so a few microseconds are parts per ten thousand.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nri_cni.metrics.endpoint import Metrics
from nri_cni.pod.model import PodInfo
from nri_cni.pod.plan import OpRecord

POD = PodInfo(id="b" * 64, name="bench", namespace="default", netns="/var/run/netns/bench")


def record(i: int) -> OpRecord:
    nets = [f"net-{k}" for k in range(3)]
    steps = [{"network": n, "ifname": f"net{k}", "op": "add", "ms": 10.0 + k} for k, n in enumerate(nets)]
    steps += [{"network": n, "ifname": f"net{k}", "op": "finalize", "ms": 1.5} for k, n in enumerate(nets)]
    return OpRecord("add", POD, started=time.time() - 0.03, networks=steps, error="" if i % 50 else "boom")


def per_call_us(metrics, calls: int, rounds: int) -> float:
    records = [record(i) for i in range(calls)]
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for r in records:
            metrics.observe_operation(r)
        results.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(results)


def render_us(metrics, rounds: int) -> float:
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        metrics.render()
        results.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(results)


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("baseline_metrics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Metrics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", help="another metrics.py to measure side by side")
    args = ap.parse_args()
    kinds = [("prometheus_client", Metrics)]
    if args.baseline:
        kinds.append(("baseline", load_baseline(args.baseline)))
    got = {}
    for name, cls in kinds * 2:  # interleaved twice: drift hits both
        m = cls(attachments=lambda: 100)
        obs = per_call_us(m, args.calls, args.rounds)
        ren = render_us(m, args.rounds)
        got.setdefault(name, []).append((obs, ren))
    for name, runs in got.items():
        obs = min(r[0] for r in runs)
        ren = min(r[1] for r in runs)
        print(f"{name:18} observe_operation {obs:7.2f} us/op   render {ren:8.1f} us/scrape")
    if args.baseline:
        new, old = (min(r[0] for r in got[k]) for k in ("prometheus_client", "baseline"))
        print(
            f"observe ratio prometheus_client/baseline: {new / old:.2f} (+{new - old:.2f} us per pod operation)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
