"""The netlink fill of a pod's results (MAC and MTU a plugin left out, read in the pod's netns)
covers what the answer shows: the shim's CNI result is the first network's alone, so only that
one is read (a netns visit each, on the pod's path); NRI's answer shows every network, so every
one is. Real plugins (bridge, macvlan over a veth master the test made) in a netns it made."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_cni.local import proto as localproto
from nri_cni.node import netlink
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.netns import get_link

pytestmark = pytest.mark.netns

SELECT = {"k8s.v1.cni.cncf.io/networks": "fastnet"}


def _two_networks(node):
    master, _ = node.jan.veth()
    return [
        {"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.41.0/24")},
        {
            "name": "fastnet",
            "namespaces": ["default"],
            "conflist": node.macvlan_net("fastnet", "10.244.42.0/24", master),
        },
    ]


@pytest.fixture
def filled(monkeypatch):
    """The in-pod interface names of every result handed to the fill, in order."""
    seen: list[list[str]] = []
    real = netlink.fill_interface_details

    async def spy(inspector, netns, result):
        seen.append([i.name for i in result.interfaces if i.sandbox])
        return await real(inspector, netns, result)

    monkeypatch.setattr(netlink, "fill_interface_details", spy)
    return seen


def _shim(command: str, socket_path: str, pod_id: str, netns: str) -> tuple[int, dict]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
    }
    conf = {
        "cniVersion": "1.0.0",
        "name": "nri-cni",
        "type": "nri-cni-shim",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": SELECT},
    }
    status, payload = localproto.call(socket_path, env, json.dumps(conf).encode())
    return status, json.loads(payload or b"{}")


def test_the_shims_answer_has_the_primarys_details_and_only_it_is_read(node, filled):
    ns = node.jan.netns()
    cfg = node.config("shim", _two_networks(node))
    pod_id = new_pod_id()

    async def scenario():
        async with DaemonHarness(node, cfg):
            status, answer = await asyncio.to_thread(_shim, "ADD", cfg["daemon"]["socket"], pod_id, ns.path)
            assert status == 0, answer
            (iface,) = [i for i in answer["interfaces"] if i.get("sandbox")]
            link = await asyncio.to_thread(get_link, "eth0", ns)
            assert (iface["name"], iface["mac"], iface["mtu"]) == ("eth0", link.mac, link.mtu)
            assert link.mtu > 0
            # both networks attached; the second's result is not answered, so not read
            assert await asyncio.to_thread(get_link, "net1", ns) is not None
            assert filled == [["eth0"]]
            status, _ = await asyncio.to_thread(_shim, "DEL", cfg["daemon"]["socket"], pod_id, ns.path)
            assert status == 0
            assert node.reservations() == []

    run(scenario())


def test_control_nris_answer_has_every_networks_details_and_each_is_read(node, filled):
    ns = node.jan.netns()
    cfg = node.config("native", _two_networks(node))
    pod = pod_message(new_pod_id(), ns.path, annotations=SELECT)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            resp = await h.runtime.run_pod_sandbox(pod)
            for iface in resp.adjust.network.interfaces:
                link = await asyncio.to_thread(get_link, iface.name, ns)
                assert (iface.mac, iface.mtu) == (link.mac, link.mtu) and link.mtu > 0
            assert sorted(filled) == [["eth0"], ["net1"]]
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)

    run(scenario())
