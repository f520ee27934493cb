"""Verify sees what a pod needs besides its interface, with the real bridge,
host-local and portmap plugins in namespaces the test made, shim mode: a route of the result
deleted in the pod's netns, the pod's portmap DNAT rules flushed, its host-local lease file
deleted: each is noticed by the next verify round (netlink and the host's rules and leases, no
CHECK) and repaired with the same IP; the pods left intact are untouched (no repair record, the
same eth0 ifindex, still ok)."""

from __future__ import annotations

import asyncio
import json
import logging
import random

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.model import AttachRequest, PodInfo
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import PodState
from tests.support.damage import dnat_ports, flush_dnat
from tests.support.harness import new_pod_id
from tests.support.netns import get_link
from tests.support.pods import pod_plan, pod_service

pytestmark = pytest.mark.netns

SUBNET = "10.244.63.0/24"
ROUTED = "10.244.99.0/24"  # a route the IPAM hands out (through the bridge: the test's own)


class Hostside:
    def __init__(self, node) -> None:
        self.node = node
        conflist = node.bridge_net("podnet", SUBNET)
        conflist["plugins"][0]["ipam"]["routes"] = [{"dst": ROUTED}]
        self.bridge = conflist["plugins"][0]["bridge"]
        doc = node.config("shim", [{"name": "podnet", "default": True, "conflist": conflist}])
        # no CHECK in these rounds: what is noticed, netlink and the host's rules and leases notice
        doc["verify"] = {"check_every": 10000}
        self.cfg = parse_config(doc, str(node.tmp / "config.yaml"))
        cni = CNIRuntime(
            [str(node.bin_dir)], self.cfg.cni.cache_dir, exec_timeout=20, executor=PluginExecutor()
        )
        self.svc = pod_service(self.cfg, pod_plan(self.cfg, cni), mode=mode_for(self.cfg))
        self.pods: dict[str, tuple[PodInfo, object, int]] = {}  # id -> pod, netns, hostPort

    async def pod(self, name: str) -> PodInfo:
        ns = await asyncio.to_thread(self.node.jan.netns)
        pod = PodInfo(new_pod_id(), name=f"ncver-{name}", namespace="default", netns=ns.path)
        port = random.randrange(20000, 40000)
        caps = {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}
        answer = await self.svc.verbs.attach(pod, AttachRequest(runtime_caps=caps))
        pod = PodInfo(pod.id, pod.name, pod.namespace, netns=pod.netns, ips=tuple(answer.ips()))
        self.pods[pod.id] = (pod, ns, port)
        return pod

    def ifindex(self, pod: PodInfo) -> int:
        link = get_link("eth0", self.pods[pod.id][1])
        assert link is not None
        return link.index

    def routes(self, pod: PodInfo) -> str:
        return self.pods[pod.id][1].run("ip", "-4", "route", "show", ROUTED).stdout

    def dnat_ports(self, pod: PodInfo) -> set:
        return dnat_ports(pod.id)

    def lease(self, pod: PodInfo):
        return self.node.ipam_dir / "podnet" / pod.ips[0]

    async def teardown(self) -> None:
        for pod, _, _ in self.pods.values():
            await self.svc.verbs.detach(pod)
        await self.svc.close()
        assert self.node.reservations() == [], "an IP leaked"
        assert self.svc.view.attachments() == [], "a cache entry leaked"


DAMAGE = {
    "route-deleted": (
        lambda w, pod: w.pods[pod.id][1].run("ip", "route", "del", ROUTED),
        "no route to " + ROUTED,
    ),
    "dnat-flushed": (lambda w, pod: flush_dnat(pod.id), "no IPv4 DNAT rule of portmap"),
    "lease-deleted": (lambda w, pod: w.lease(pod).unlink(), "holds no lease of"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_host_side_damage_is_noticed_in_the_next_round_and_repaired_intact_pods_untouched(
    node, caplog, damage
):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")
    w = Hostside(node)
    do, words = DAMAGE[damage]

    async def scenario():
        victim, *intact = [await w.pod(n) for n in ("victim", "intact1", "intact2")]
        w.svc.roster.listed([victim, *intact])
        first = {h.pod_id: h.state for h in await w.svc.timers.verify()}
        assert set(first.values()) == {PodState.OK}, first
        for pod in (victim, *intact):  # what the checks below look at is there to begin with
            assert ROUTED in await asyncio.to_thread(w.routes, pod)
            assert await asyncio.to_thread(w.dnat_ports, pod) == {("tcp", w.pods[pod.id][2])}
            assert w.lease(pod).read_text().splitlines()[0].strip() == pod.id
        index = {p.id: await asyncio.to_thread(w.ifindex, p) for p in intact}

        await asyncio.to_thread(do, w, victim)
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}  # the next round
        health = verdicts[victim.id]
        assert health.state is PodState.REPAIRED, health.to_dict()
        assert words in health.reason, health.reason
        # repaired with the same IP: the route, the DNAT rule and the lease are back
        link = await asyncio.to_thread(get_link, "eth0", w.pods[victim.id][1])
        assert tuple(a.split("/")[0] for a in link.addrs if "." in a) == victim.ips
        assert ROUTED in await asyncio.to_thread(w.routes, victim)
        assert await asyncio.to_thread(w.dnat_ports, victim) == {("tcp", w.pods[victim.id][2])}
        assert w.lease(victim).read_text().splitlines()[0].strip() == victim.id
        # the intact pods: untouched
        for pod in intact:
            assert verdicts[pod.id].state is PodState.OK and verdicts[pod.id].repairs == 0
            assert await asyncio.to_thread(w.ifindex, pod) == index[pod.id]
        records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
        assert [r["podId"] for r in records if r["op"] == "repair"] == [victim.id]
        again = {h.pod_id: h for h in await w.svc.timers.verify()}
        assert [a.finding for a in again[victim.id].attachments] == ["ok"]
        await w.teardown()

    asyncio.run(scenario())
