"""Secondary mode's stop path in each runtime's order, driven by the NRI double as that
runtime (tests/support/nri_runtime.py; pinned to the real ones by tests/e2e/test_nri_containerd.py
and tests/e2e/test_crio_nri.py): containerd sends NRI STOP, then runs its own CNI DEL and
removes the netns; CRI-O does its CNI DEL and removes the netns first, then sends STOP with the
netns path of a namespace that no longer exists, then REMOVE. Either way nri-cni's extra
network is released: IPAM lease, cache entry, host-side veth."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.api import nri_pb2
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.netns import delete_netns
from tests.support.nri_runtime import CONTAINERD, CRIO

pytestmark = pytest.mark.netns


def _cached(node) -> list[str]:
    results = node.cache_dir / "results"
    return sorted(p.name for p in results.iterdir()) if results.exists() else []


@pytest.mark.parametrize(
    "kind, held_at_teardown",
    [
        (CONTAINERD, 0),  # control case: STOP first, nri-cni's DEL ran in a live netns
        (CRIO, 1),  # the runtime's teardown first: nri-cni still holds its lease, its DEL comes later
    ],
    ids=["containerd", "cri-o"],
)
def test_secondary_stop_releases_the_extra_network_in_the_runtimes_order(node, kind, held_at_teardown):
    ns = node.jan.netns()
    net = node.bridge_net("lan", "10.244.48.0/24")
    cfg = node.config(
        "secondary", [{"name": "lan", "default": True, "conflist": net}], primary_network="runtimes-own"
    )
    cfg["cni"]["runtime_cache_dir"] = str(node.tmp / "runtime-cache")  # the runtime's eth0: none here
    pod = pod_message(new_pod_id(), ns.path, name="web")
    pod.ips.append("10.88.0.5")  # the runtime's own IP, filled in at RUN by both runtimes
    checker = node.leak_checker(ns).start()
    held: list[int] = []

    async def teardown() -> None:
        """The runtime's own CNI DEL (nothing of nri-cni's) and its netns removal."""
        held.append(len(node.reservations()))
        assert await asyncio.to_thread(delete_netns, ns)

    async def scenario():
        async with DaemonHarness(node, cfg, kind=kind) as h:
            await h.runtime.state_change(nri_pb2.RUN_POD_SANDBOX, pod)
            checker.add_markers(pod.id)
            assert len(node.reservations()) == 1 and len(_cached(node)) == 1
            await asyncio.to_thread(checker.learn)
            await h.runtime.stop_pod(pod, teardown)
            assert held == [held_at_teardown]
            assert node.reservations() == [] and _cached(node) == []
            await h.runtime.state_change(nri_pb2.REMOVE_POD_SANDBOX, pod)

    run(scenario())
    assert node.reservations() == [] and _cached(node) == []
    assert checker.leaks() == []
