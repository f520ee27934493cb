"""Verify sees the bridge plugin's masquerade (`ipMasq: true`, iptables and nftables,
IPv4+IPv6): a pod's masquerade rules deleted are noticed by the next round (the host's rules,
read once a round, no CHECK) and repaired with the same IPs, the other pods untouched; a
firewall reload flushing the whole nat table makes every pod noticed and repaired with the same
IPs; the pods' DEL leaves no rule. (With the nftables backend the bridge plugin's DEL also
tears down iptables chains it never made and fails on iptables-nft when they are not there: the
test makes them empty before each DEL, see standin.chains_for_plugin_del.)

The bridge plugin runs, and nri-cni's verify reads, inside a network namespace the test made that
stands in for the host (the pods' netns hang off a bridge inside it: tests/support/standin.py),
so no masquerade rule is ever made in the machine's own netns; the test asserts, before and
after, that its nat tables mention none of the test's subnets or pods."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.model import AttachRequest, PodInfo
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import PodState
from nri_cni.service.service import PodService
from tests.support.harness import new_pod_id
from tests.support.netns import get_link
from tests.support.pods import pod_plan, pod_service
from tests.support.standin import (
    chains_for_plugin_del,
    drop_masq,
    flush_masq,
    machine_nat_mentions,
    masq_rules,
    run_in_netns,
)

pytestmark = pytest.mark.netns

SUBNET4, SUBNET6 = "10.244.166.0/24", "fd44:166::/64"
MENTIONS = ("10.244.166.", "fd44:166:")


class Masqueraded:
    """Three pods on one dual-stack bridge network with ipMasq, inside the stand-in `host`."""

    def __init__(self, node, host, backend: str) -> None:
        self.node, self.host, self.backend = node, host, backend
        conflist = node.bridge_net("masqnet", SUBNET4)
        bridge = conflist["plugins"][0]
        bridge.update(ipMasq=True, ipMasqBackend=backend)
        bridge["ipam"]["ranges"].append([{"subnet": SUBNET6}])
        conflist["plugins"] = [bridge]  # the bridge alone: the masquerade is what is read
        doc = node.config("shim", [{"name": "masqnet", "default": True, "conflist": conflist}])
        doc["verify"] = {"check_every": 10000}  # no CHECK: what is noticed, the host's rules notice
        self.cfg = parse_config(doc, str(node.tmp / "config.yaml"))
        self.svc: PodService | None = None
        self.pods: dict[str, tuple[PodInfo, object]] = {}  # id -> pod, its netns

    def start(self) -> None:
        cni = CNIRuntime(
            [str(self.node.bin_dir)], self.cfg.cni.cache_dir, exec_timeout=20, executor=PluginExecutor()
        )
        self.svc = pod_service(self.cfg, pod_plan(self.cfg, cni), mode=mode_for(self.cfg))

    async def pod(self, name: str) -> PodInfo:
        ns = await asyncio.to_thread(self.node.jan.netns)
        pod = PodInfo(new_pod_id(), name=f"ncmasq-{name}", namespace="default", netns=ns.path)
        answer = await self.svc.verbs.attach(pod, AttachRequest())
        pod = PodInfo(pod.id, pod.name, pod.namespace, netns=pod.netns, ips=tuple(answer.ips()))
        assert len(pod.ips) == 2, pod.ips  # one address of each family
        self.pods[pod.id] = (pod, ns)
        return pod

    def masq(self, pod: PodInfo) -> set[str]:
        return masq_rules(self.host, self.backend, pod.id)

    def before_del(self, *pods: PodInfo) -> None:
        """nftables: the iptables chains the plugin's DEL needs (standin.chains_for_plugin_del)."""
        if self.backend == "nftables":
            chains_for_plugin_del(self.host, "masqnet", [p.id for p in pods])

    def eth0(self, pod: PodInfo):
        link = get_link("eth0", self.pods[pod.id][1])
        assert link is not None
        return link


@pytest.mark.parametrize("backend", ["iptables", "nftables"])
def test_masquerade_deleted_or_flushed_is_noticed_and_repaired_with_the_same_ips(node, caplog, backend):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")
    assert machine_nat_mentions(MENTIONS) == []
    host = node.jan.netns()  # stands in for the host: the bridge and its nat rules live here
    w = Masqueraded(node, host, backend)
    ids: list[str] = []

    async def scenario():
        w.start()
        victim, *intact = [await w.pod(n) for n in ("victim", "intact1", "intact2")]
        ids.extend(p.id for p in (victim, *intact))
        pods = [victim, *intact]
        w.svc.roster.listed(pods)
        first = {h.pod_id: h.state for h in await w.svc.timers.verify()}
        assert set(first.values()) == {PodState.OK}, first
        for pod in pods:  # the rules are there to begin with, one per address
            assert await asyncio.to_thread(w.masq, pod) == set(pod.ips)

        # one pod's rules deleted: noticed and repaired, the others untouched
        index = {p.id: (await asyncio.to_thread(w.eth0, p)).index for p in intact}
        await asyncio.to_thread(drop_masq, host, backend, victim.id)
        await asyncio.to_thread(w.before_del, victim)
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        health = verdicts[victim.id]
        assert health.state is PodState.REPAIRED, health.to_dict()
        assert "masquerade rule" in health.reason, health.reason
        assert await asyncio.to_thread(w.masq, victim) == set(victim.ips)
        link = await asyncio.to_thread(w.eth0, victim)
        assert {a.split("/")[0] for a in link.addrs} >= set(victim.ips)
        for pod in intact:
            assert verdicts[pod.id].state is PodState.OK and verdicts[pod.id].repairs == 0
            assert (await asyncio.to_thread(w.eth0, pod)).index == index[pod.id]
        records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
        assert [r["podId"] for r in records if r["op"] == "repair"] == [victim.id]

        # a firewall reload flushes them all: every pod noticed, repaired with the same IPs
        await asyncio.to_thread(flush_masq, host, backend)
        for pod in pods:
            assert await asyncio.to_thread(w.masq, pod) == set()
        await asyncio.to_thread(w.before_del, *pods)
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        for pod in pods:
            assert verdicts[pod.id].state is PodState.REPAIRED, verdicts[pod.id].to_dict()
            assert "masquerade rule" in verdicts[pod.id].reason
            assert await asyncio.to_thread(w.masq, pod) == set(pod.ips)
        again = {h.pod_id: h for h in await w.svc.timers.verify()}
        assert {a.finding for h in again.values() for a in h.attachments} == {"ok"}

        await asyncio.to_thread(w.before_del, *pods)
        for pod, _ in w.pods.values():
            await w.svc.verbs.detach(pod)
        for pod in pods:  # the DEL took its rules
            assert await asyncio.to_thread(w.masq, pod) == set()
        await w.svc.close()
        w.svc = None
        assert node.reservations() == [], "an IP leaked"

    async def guarded():
        try:
            await scenario()
        finally:
            if w.svc is not None:
                await asyncio.to_thread(w.before_del, *(p for p, _ in w.pods.values()))
                for pod, _ in w.pods.values():
                    await w.svc.verbs.detach(pod)
                await w.svc.close()

    try:
        run_in_netns(host, lambda: asyncio.run(guarded()))
    finally:
        # the machine's own nat tables never saw a rule of this test
        assert machine_nat_mentions([*MENTIONS, *ids]) == []
