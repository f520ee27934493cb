"""NRI-native mode: the daemon attaches every network in RunPodSandbox and answers with the IPs
and interfaces, decoded here by the runtime-side NRI double from real bytes; at CreateContainer it
answers a container's adjustment (docs/containers.md). Real plugins (bridge, portmap, macvlan over
a veth master the test made) in namespaces the test made."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import sys

import pytest

from nri_cni.errors import RPCError
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.netns import get_link
from tests.support.nri_runtime import container_at_create

META_PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "meta_plugin.py")

pytestmark = pytest.mark.netns


def _two_networks(node, *, finalize=None, second=None):
    master, _ = node.jan.veth()  # macvlan's parent: one end of a veth on the host
    eth0 = node.bridge_net("podnet", "10.244.31.0/24")
    if finalize is not None:
        eth0["finalize_plugins"] = finalize
    net1 = second or node.macvlan_net("fastnet", "10.244.32.0/24", master)
    return [
        {"name": "podnet", "default": True, "conflist": eth0},
        {"name": "fastnet", "namespaces": ["default"], "conflist": net1},
    ]


def test_run_pod_answers_ips_and_interfaces_that_netlink_shows(node):
    ns = node.jan.netns()
    cfg = node.config("native", _two_networks(node, finalize=[node.fake("fake-finalize")]))
    pod_id = new_pod_id()
    pod = pod_message(pod_id, ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "fastnet"})
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            resp = await h.runtime.run_pod_sandbox(pod)
            checker.add_markers(pod_id, *resp.adjust.network.ips)
            await asyncio.to_thread(checker.learn)
            net = resp.adjust.network
            # PR #295's field: plain addresses, primary network first
            assert [
                ipaddress.ip_address(ip) in ipaddress.ip_network(sub)
                for ip, sub in zip(net.ips, ("10.244.31.0/24", "10.244.32.0/24"))
            ] == [True, True]
            by_name = {i.name: i for i in net.interfaces}
            assert set(by_name) == {"eth0", "net1"}
            for iface in net.interfaces:
                link = await asyncio.to_thread(get_link, iface.name, ns)
                assert link is not None, iface.name
                assert iface.mac == link.mac
                assert iface.mtu == link.mtu and iface.mtu > 0
                assert iface.sandbox == ns.path
                assert [ip.address for ip in iface.ips] == [
                    a for a in link.addrs if ipaddress.ip_interface(a).version == 4
                ]
            assert by_name["eth0"].network == "podnet" and by_name["net1"].network == "fastnet"
            assert by_name["eth0"].metadata["cni.dev/primary"] == "true"
            assert by_name["net1"].metadata["cni.dev/network"] == "fastnet"
            # FINALIZE ran once, after both ADDs, with podnet's result as prevResult
            calls = node.calls()
            assert [c["command"] for c in calls] == ["FINALIZE"]
            assert calls[0]["env"]["CNI_IFNAME"] == "eth0"
            assert calls[0]["stdin"]["prevResult"]["ips"][0]["address"].startswith("10.244.31.")
            assert len(node.reservations()) == 2

            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
            assert node.reservations() == []

    run(scenario())
    assert checker.leaks() == []


def test_second_network_failure_rolls_back_the_first(node):
    ns = node.jan.netns()
    # macvlan over a master that does not exist: the second network's ADD fails for real
    bad = node.macvlan_net("fastnet", "10.244.34.0/24", "nctnomaster0")
    cfg = node.config("native", _two_networks(node, second=bad))
    pod_id = new_pod_id()
    pod = pod_message(pod_id, ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "fastnet"})
    checker = node.leak_checker(ns).start()
    checker.add_markers(pod_id)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            msg = str(err.value)
            assert "fastnet" in msg and "macvlan" in msg, msg
            assert list(node.cache_dir.glob("results/*")) == []
            assert node.reservations() == []

    run(scenario())
    assert checker.leaks() == []


def test_finalize_failure_rolls_back_every_network(node):
    ns = node.jan.netns()
    fail = node.fake("fake-fail", FINALIZE={"error": {"code": 120, "msg": "route fix-up failed"}})
    cfg = node.config("native", _two_networks(node, finalize=[fail]))
    pod = pod_message(new_pod_id(), ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "fastnet"})
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            assert "route fix-up failed" in str(err.value)
            assert "fake-fail" in str(err.value)

    run(scenario())
    assert node.reservations() == []
    assert list(node.cache_dir.glob("results/*")) == []
    assert checker.leaks() == []


@pytest.mark.parametrize(
    "annotation, reason",
    [
        ("secretnet", "not allowed"),
        ("../../etc/passwd", "not valid"),
        ('[{"name": "fastnet", "interface": "eth0/../x"}]', "interface name"),
        ('[{"name": "fastnet", "cni-args": {"x": "y"}}]', "unsupported key"),
        ("kube-system/fastnet", "another namespace"),
    ],
)
def test_annotation_outside_the_allow_list_is_refused(node, annotation, reason):
    ns = node.jan.netns()
    nets = _two_networks(node)
    nets.append(
        {
            "name": "secretnet",
            "namespaces": ["kube-system"],
            "conflist": node.bridge_net("secretnet", "10.244.35.0/24"),
        }
    )
    cfg = node.config("native", nets)
    pod = pod_message(new_pod_id(), ns.path, annotations={"k8s.v1.cni.cncf.io/networks": annotation})

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            assert reason in str(err.value)

    run(scenario())
    assert [li.name for li in ns.links()] == ["lo"]
    assert node.reservations() == []


def test_synchronize_collects_attachments_of_pods_the_runtime_lost(node):
    ns1, ns2 = node.jan.netns(), node.jan.netns()
    cfg = node.config("native", _two_networks(node)[:1])
    keep = pod_message(new_pod_id(), ns1.path)
    lost = pod_message(new_pod_id(), ns2.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(keep)
            await h.runtime.run_pod_sandbox(lost)
        assert len(node.reservations()) == 2
        # The runtime comes back knowing only `keep` (the other was removed while we were away).
        async with DaemonHarness(node, cfg, pods=[keep]):
            pass
        res = node.reservations()
        assert [r.container_id for r in res] == [keep.id]
        assert [li.name for li in await asyncio.to_thread(ns2.links)] == ["lo"]
        async with DaemonHarness(node, cfg, pods=[]):
            pass
        assert node.reservations() == []

    run(scenario())


def test_a_pod_that_started_while_nri_cni_was_down_is_reported_missed_not_attached(node):
    """A pod that started while nri-cni was down is missed, not attached: the runtime learns a
    pod's IPs only from the RunPodSandbox answer; attaching the
    pod after the fact would give it networks the runtime never reports. It is reported broken
    "missed", with what the admin does, and nothing is attached."""
    ns = node.jan.netns()
    cfg = node.config("native", _two_networks(node)[:1])
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg, pods=[pod]) as h:
            health = h.daemon.pods.health.get(pod.id)
            assert health is not None and health.state.value == "broken", health
            assert health.code.value == "missed" and "delete the pod" in health.reason
            assert node.reservations() == []
            assert [li.name for li in await asyncio.to_thread(ns.links)] == ["lo"]
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
            assert h.daemon.pods.health.get(pod.id) is None
        assert node.reservations() == []

    run(scenario())


def test_a_container_of_a_pod_gets_its_networks_and_a_pod_without_none(node):
    """CreateContainer (sent as containerd sends it): a container of a pod with nri-cni's networks
    gets the network-status annotation, one annotation per metadata key and the pod's status
    directory mounted read-only, whose file says what the annotation says. The control: a
    host-network pod (no netns, so no attachment of nri-cni's), its container created the same
    way, gets no adjustment. The pod's directory goes at RemovePodSandbox."""
    meta = node.bin_dir / "nct-meta"
    meta.write_text(f"#!{os.path.realpath(sys.executable)} -IS\n" + open(META_PLUGIN).read())
    meta.chmod(0o755)
    master, _ = node.jan.veth()
    net1 = node.macvlan_net("fastnet", "10.244.36.0/24", master)
    net1["plugins"].append({"type": "nct-meta", "metadata": {"example.com/vf": "3"}})
    networks = [
        {"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.35.0/24")},
        {"name": "fastnet", "namespaces": ["default"], "conflist": net1},
    ]
    cfg = node.config("native", networks)
    ns = node.jan.netns()
    pod_id = new_pod_id()
    pod = pod_message(pod_id, ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "fastnet"})
    hostnet = pod_message(new_pod_id(), "")
    pod_dir = node.state_dir / "containers" / pod_id
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            answer = await h.runtime.run_pod_sandbox(pod)
            checker.add_markers(pod_id, *answer.adjust.network.ips)
            resp = await h.runtime.create_container(pod, container_at_create(pod, "app", ["sleep", "1"]))
            assert resp is not None and resp.HasField("adjust")
            annotations = dict(resp.adjust.annotations)
            status = json.loads(annotations["k8s.v1.cni.cncf.io/network-status"])
            macs = {i.name: i.mac for i in answer.adjust.network.interfaces}
            assert [(e["interface"], e["mac"]) for e in status] == [
                ("eth0", macs["eth0"]),
                ("net1", macs["net1"]),
            ]
            assert status[1]["metadata"] == {"example.com/vf": "3"}
            assert annotations["nri-cni.io/net1/example.com/vf"] == "3"
            assert [(m.destination, m.type, m.source, "ro" in m.options) for m in resp.adjust.mounts] == [
                ("/run/nri-cni", "bind", str(pod_dir), True)
            ]
            assert json.loads((pod_dir / "network-status.json").read_text()) == status

            await h.runtime.run_pod_sandbox(hostnet)
            control = await h.runtime.create_container(hostnet, container_at_create(hostnet, "app"))
            assert control is not None and not control.HasField("adjust")
            assert not (node.state_dir / "containers" / hostnet.id).exists()

            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
            assert not pod_dir.exists()

    run(scenario())
    assert checker.leaks() == []
