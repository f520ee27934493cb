"""External damage in NRI-native mode: nri-cni as a real process against the
runtime-side NRI double; the CNI bridge deleted, a pod's host veth deleted, its eth0 deleted, its
address flushed. Within one verify period (a short `verify.interval`, netlink and CNI CHECK every
round) plus the repair's own time, every damaged pod has eth0 back with the IP the runtime took
from nri-cni's answer, the host end on the bridge, an operation record "repair", and the pods
reach each other. After the pods are removed nothing is left.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.damage import KINDS, damage, damage_left
from tests.support.faultnode import broken_by_name
from tests.support.harness import new_pod_id, pod_message, run
from tests.support.nri_runtime import NriRuntime
from tests.support.nricni import NriCni
from tests.support.podtruth import RuntimePod, pod_interfaces, reaches, whole_problems
from tests.support.recovery_node import wait_settled

pytestmark = pytest.mark.netns

VERIFY = {"interval": "1s", "check_every": 1}
# the damage is repaired in the next verify round (1 s): the test waits for that, with a deadline
# for a hang only (one repair, DEL + ADD of a chain, is a second or two on a quiet machine)
REPAIR_DEADLINE = 120.0


def _wait_repaired(daemon: NriCni, pods, before, bridge: str) -> float:
    t0 = time.monotonic()
    while True:
        problems = []
        for pod in pods:
            problems += damage_left(pod, before[pod.id], ["eth0"], bridge)
            problems += whole_problems(pod, ["eth0"])
        if not problems:
            return time.monotonic() - t0
        if time.monotonic() - t0 > REPAIR_DEADLINE:
            broken = broken_by_name(daemon)
            raise AssertionError(f"{problems}\nbroken: {broken}\n{daemon.log_tail(60)}")
        time.sleep(0.05)


@pytest.mark.parametrize("kind", KINDS)
def test_external_damage_is_repaired_native(node, kind):
    podnet = node.bridge_net("podnet", "10.244.72.0/24")
    bridge = podnet["plugins"][0]["bridge"]
    cfg = node.config("native", [{"name": "podnet", "default": True, "conflist": podnet}], verify=VERIFY)
    runtime = NriRuntime(
        cfg["nri"]["socket"],
        runtime_name="nri-test-double",
        runtime_version="1.0.0",
        request_timeout_ms=20000,
    )
    daemon = NriCni(node.tmp, cfg)
    namespaces = [node.jan.netns(), node.jan.netns()]
    messages = [pod_message(new_pod_id(), ns.path, name=f"dmg-{i}") for i, ns in enumerate(namespaces)]

    async def scenario():
        await runtime.start()
        try:
            await asyncio.to_thread(daemon.start)
            await runtime.wait_plugin(1)
            await asyncio.to_thread(wait_settled, daemon)
            checker = await asyncio.to_thread(lambda: node.leak_checker(*namespaces).start())
            pods = []
            for msg in messages:
                resp = await runtime.run_pod_sandbox(msg)
                msg.ips.extend(resp.adjust.network.ips)  # the runtime keeps nri-cni's answer
                runtime.pods.append(msg)
                pods.append(RuntimePod(msg.id, msg.linux.namespaces[0].path, tuple(msg.ips)))
            checker.add_markers(*(p.id for p in pods))
            await asyncio.to_thread(checker.learn)

            def damaged_and_repaired() -> float:
                before = {p.id: pod_interfaces(p.netns) for p in pods}
                damage(kind, pods[0], "eth0", bridge)
                return _wait_repaired(daemon, pods, before, bridge)

            took = await asyncio.to_thread(damaged_and_repaired)
            print(f"{kind}: repaired {took:.2f} s after the damage")
            assert await asyncio.to_thread(broken_by_name, daemon) == {}
            damaged = pods if kind == "bridge-deleted" else pods[:1]
            repaired = {op["podId"] for op in daemon.op_lines() if op["op"] == "repair"}
            assert {p.id for p in damaged} <= repaired
            a, b = pods
            assert await asyncio.to_thread(reaches, a, b.ips[0])
            assert await asyncio.to_thread(reaches, b, a.ips[0])
            for msg in messages:
                await runtime.stop_pod_sandbox(msg)
                await runtime.remove_pod_sandbox(msg)
            runtime.pods = []
            assert node.reservations() == []
            assert list(node.cache_dir.glob("results/*")) == []
            assert await asyncio.to_thread(checker.leaks) == []
        finally:
            await asyncio.to_thread(daemon.stop)
            await runtime.stop()

    run(scenario())
