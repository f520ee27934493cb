"""A pod with three networks: ADDed at once vs one after another vs each chain alone.

Three bridge + host-local networks (real plugins, bridges and netns of the bench's own). Per
round, in an order that rotates, one pod is attached and detached by each of five pod services
that differ only in their config: all three networks at once (`limits.parallel_per_pod: 3`),
all three one after another (`parallel_per_pod: 1`, Multus's way), and each network alone.
The figure is the median over rounds of (at once) / (its bound, that round): what a pod waits
for beyond what the machine allows. The bound is the larger of two: the slowest chain alone, and
the plugins' CPU time of the at-once ADD divided by the CPUs (`at_once_bound`: 2 CPUs cannot
run three CPU-bound chains as fast as one). Times are the pod service's attach, as the daemon runs
it (intent record, ADDs, FINALIZE, netlink fill); the plugins' CPU time is this process's
children's (getrusage: the plugins it waited for, and the IPAM plugins they waited for).

Then the anchor (--containerd, `python -m bench` runs it): containerd's own CNI with the same
three networks at once (`max_conf_num = 3`: go-cni ADDs eth0, eth1, eth2 in one goroutine each)
against nri-cni in shim mode creating the same pod (the shim is containerd's one CNI network,
the daemon ADDs the three at once): two private containerd instances (tests/support/
containerd.py), three bridge + host-local networks each, driven over CRI, the two taking turns
pod by pod (bench_pods.py's alternation and checks: CRI IP in eth0's subnet, the third
interface with an address, no cache entry or lease left). Shim mode, not secondary: in
secondary mode containerd's own CNI makes eth0 before the NRI call, so nri-cni's two networks
could only start after it; in shim mode nri-cni makes all three, as containerd does. The figure:
RunPodSandbox median shim / containerd (goal `attach3`, bench/goals.py). A third instance,
the floor, runs containerd's own three networks with the compiled shim chained after eth0's
bridge, answered at once by bench/null_plugin.py, which hears the NRI pod events doing nothing
(bench_pods.py's `floor`): floor / containerd is what no daemon's work is in.

  sudo ./.venv/bin/python bench/bench_attach.py --pods 20 [--containerd]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nri_cni.cni.exec import PluginExecutor  # noqa: E402
from nri_cni.cni.runtime import CNIRuntime  # noqa: E402
from nri_cni.config import parse_config  # noqa: E402
from nri_cni.pod.model import PodInfo  # noqa: E402
from nri_cni.service.modes import mode_for  # noqa: E402
from nri_cni.service.service import PodService  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.conflists import bridge_conflist, host_local, network  # noqa: E402
from tests.support.daemon_config import daemon_config  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402
from tests.support.names import free_subnet, unique_name  # noqa: E402
from tests.support.pods import pod_plan, pod_service  # noqa: E402

NETS = ("benchnet-a", "benchnet-b", "benchnet-c")


def _networks(jan: Janitor, ipam_dir: Path) -> list[dict[str, Any]]:
    out = []
    used: list[str] = []
    for n, name in enumerate(NETS):
        bridge = unique_name("bb")
        jan.track_link(bridge)
        subnet = str(free_subnet(exclude=used))
        used.append(subnet)
        conflist = bridge_conflist(name, bridge, host_local(ipam_dir, subnet))
        out.append(network(conflist, interface="eth0" if n == 0 else f"net{n}"))
    return out


def _service(tmp: Path, name: str, networks: list[dict[str, Any]], per_pod: int) -> PodService:
    own = tmp / name
    (own / "_finalize.d").mkdir(parents=True)
    if len(networks) == 1:
        networks = [{**networks[0], "interface": "eth0"}]
    doc = daemon_config(
        "shim",
        networks,
        nri_socket=own / "nri.sock",
        daemon_socket=own / "daemon.sock",
        state_dir=own / "state",
        bin_dirs=[REAL_PLUGINS],
        cache_dir=own / "cache",
        finalize_dir=own / "_finalize.d",
        limits={"parallel_per_pod": per_pod},
        gc={"interval": 0},
        status={"interval": 0},
    )
    cfg = parse_config(doc, str(own / "config.yaml"))
    cni = CNIRuntime(list(cfg.cni.bin_dirs), cfg.cni.cache_dir, executor=PluginExecutor())
    return pod_service(cfg, pod_plan(cfg, cni), mode=mode_for(cfg))


def children_cpu_ms() -> float:
    """CPU time (user + system) of the child processes this process waited for, so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1000


def at_once_bound(slowest_alone_ms: float, plugins_cpu_ms: float, cpus: int) -> float:
    """The least an ADD of the networks at once can take: its slowest chain alone, or the
    plugins' CPU time spread over every CPU, whichever is larger."""
    return max(slowest_alone_ms, plugins_cpu_ms / cpus)


async def _rounds(services: dict[str, PodService], netns: list[str], warmup: int) -> dict[str, list[float]]:
    """Each service's attach time per round (ms), and `cpu_at_once`: the plugins' CPU time
    of each at-once attach (ms)."""
    times: dict[str, list[float]] = {k: [] for k in [*services, "cpu_at_once"]}
    names = list(services)
    for r, path in enumerate(netns):
        order = names[r % len(names) :] + names[: r % len(names)]  # the order rotates
        for name in order:
            pod = PodInfo(uuid.uuid4().hex * 2, f"b{r}", "nct-bench", str(uuid.uuid4()), netns=path)
            cpu0 = children_cpu_ms()
            t0 = time.perf_counter()
            await services[name].verbs.attach(pod)
            ms = (time.perf_counter() - t0) * 1000
            cpu = children_cpu_ms() - cpu0
            await services[name].verbs.detach(pod)
            if r >= warmup:
                times[name].append(ms)
                if name == "at_once":
                    times["cpu_at_once"].append(cpu)
    for svc in services.values():
        await svc.close()
    return times


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nri-cni-bench-attach-") as tmp_s:
        tmp = Path(tmp_s)
        jan = Janitor()
        try:
            networks = _networks(jan, tmp / "ipam")
            services = {
                "at_once": _service(tmp, "at_once", networks, 3),
                "one_by_one": _service(tmp, "one_by_one", networks, 1),
                **{f"alone_{n}": _service(tmp, f"alone_{n}", [net], 1) for n, net in enumerate(networks)},
            }
            netns = [jan.netns().path for _ in range(args.warmup + args.pods)]
            times = asyncio.run(_rounds(services, netns, args.warmup))
        finally:
            failed = jan.cleanup()
            if failed:
                print(f"bench_attach: cleanup: {failed}", file=sys.stderr)
    slowest = [max(times[f"alone_{n}"][i] for n in range(len(NETS))) for i in range(args.pods)]
    at_once, one_by_one = times["at_once"], times["one_by_one"]
    cpus = os.cpu_count() or 1
    by_cpu = [c / cpus for c in times["cpu_at_once"]]
    bound = [at_once_bound(s, c, cpus) for s, c in zip(slowest, times["cpu_at_once"], strict=True)]
    return {
        "pods": args.pods,
        "cpus": cpus,
        "at_once_median_ms": statistics.median(at_once),
        "one_by_one_median_ms": statistics.median(one_by_one),
        "slowest_alone_median_ms": statistics.median(slowest),
        "plugins_cpu_median_ms": statistics.median(times["cpu_at_once"]),
        "cpu_bound_median_ms": statistics.median(by_cpu),
        "cpu_bound_rules": sum(c > s for s, c in zip(slowest, by_cpu, strict=True)),
        "at_once_over_bound": statistics.median(a / b for a, b in zip(at_once, bound, strict=True)),
        "at_once_over_slowest": statistics.median(a / s for a, s in zip(at_once, slowest)),
        "at_once_over_one_by_one": statistics.median(a / b for a, b in zip(at_once, one_by_one)),
    }


# subnets of the containerd anchor's networks (bench_pods.py uses 10.246.160-168)
CTD_SUBNETS = ("10.246.170.0/24", "10.246.171.0/24", "10.246.172.0/24")
SHIM_SUBNETS = ("10.246.173.0/24", "10.246.174.0/24", "10.246.175.0/24")
FLOOR_SUBNETS = ("10.246.178.0/24", "10.246.179.0/24", "10.246.180.0/24")


def measure_containerd(args: argparse.Namespace) -> dict[str, Any]:
    """RunPodSandbox of a 3-network pod: containerd (max_conf_num = 3) vs nri-cni's shim mode."""
    import contextlib
    import secrets

    from bench import bench_pods
    from tests.support.containerd import Containerd, cni_plugin_dir
    from tests.support.hostnet import BridgeNetwork
    from tests.support.nricni import NriCni

    with contextlib.ExitStack() as stack:
        b = bench_pods.Bench(argparse.Namespace(pods=args.pods, warmup=args.warmup, host_ports=False), stack)

        def nets(tag: str, subnets: tuple[str, ...]) -> list[BridgeNetwork]:
            out = []
            for n, subnet in enumerate(subnets):
                d = b.tmp / f"net-{tag}-{n}"
                d.mkdir()
                name = f"nct-attach-{tag}{n}-{secrets.token_hex(3)}"
                net = BridgeNetwork(d, bridge=unique_name("ba"), subnet=subnet, portmap=False, name=name)
                stack.callback(lambda net=net: b.problems.extend(net.cleanup()))
                out.append(net)
            return out

        def one_conf_dir(nets: list[BridgeNetwork]) -> None:  # eth0, eth1, eth2 in name order
            for n, net in enumerate(nets[1:], start=1):
                (nets[0].conf_dir / f"{10 + 10 * n}-nct-{n}.conflist").write_text(json.dumps(net.conflist))

        ctd_nets = nets("c", CTD_SUBNETS)
        one_conf_dir(ctd_nets)
        ctd = b.containerd("attach-native3", ctd_nets[0].conf_dir, [cni_plugin_dir()], max_conf_num=3)
        native = bench_pods.Mode(
            "containerd3", ctd, ctd_nets[0], extra_if="eth2", ipam_dirs=[n.ipam_dir for n in ctd_nets]
        )
        # the floor: containerd's own three networks, the compiled shim chained after eth0's
        # bridge, answered at once by bench/null_plugin.py, which hears the NRI pod events
        floor_nets = nets("f", FLOOR_SUBNETS)

        def floor_containerd(name: str, conf_dir: Path, bins: list, _net: BridgeNetwork) -> Containerd:
            one_conf_dir(floor_nets)  # eth0's list has the shim chained by now
            return b.containerd(name, conf_dir, bins, max_conf_num=3)

        floor = dataclasses.replace(
            b.floor("floor3", floor_containerd, floor_nets[0]),
            extra_if="eth2",
            ipam_dirs=[n.ipam_dir for n in floor_nets],
        )
        daemons = b.daemons()
        shim_nets = nets("s", SHIM_SUBNETS)
        setup = b.shim_setup("attach")
        sctd = b.containerd("attach-shim3", setup.conf_dir, [setup.bin_dir])
        networks = [
            {
                "name": n.name,
                "default": True,
                "interface": "eth0" if i == 0 else f"net{i}",
                "conflist": n.conflist,
            }
            for i, n in enumerate(shim_nets)
        ]
        cfg = setup.config(sctd.nri_socket, networks, limits={"parallel_per_pod": 3})
        daemon = NriCni(setup.tmp, cfg)
        daemons.append(daemon)
        daemon.start()
        shim = bench_pods.Mode(
            "shim3",
            sctd,
            shim_nets[0],
            extra_if="net2",
            ipam_dirs=[n.ipam_dir for n in shim_nets],
            daemon=daemon,
        )
        print(f"3 networks per pod: containerd (max_conf_num 3) vs shim, {args.pods} pods each, alternated")
        b.run([native, shim, floor])
        rep = b.report([native, shim, floor], "shim3", "containerd3")
        rep["floor"] = bench_pods.floor_compare(rep["modes"], own="containerd3", shim="shim3", floor="floor3")
        print(bench_pods.describe_floor(rep["floor"], "containerd's own"))
    if b.problems:
        raise RuntimeError(f"bench_attach --containerd: cleanup problems: {b.problems}")
    return rep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--containerd", action="store_true", help="also the anchor: containerd's max_conf_num = 3")
    args = p.parse_args(argv)
    rep = measure(args)
    print(json.dumps(rep, indent=2))
    if args.containerd:
        ctd = measure_containerd(args)
        print(
            json.dumps(
                {k: v for k, v in ctd.items() if k != "modes"} | {"compare": ctd.get("compare")}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
