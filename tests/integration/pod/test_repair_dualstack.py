"""Dual-stack and IPv6-only pods with the real bridge + host-local plugins, in namespaces the
test made: both families attached and answered; a flushed IPv6 address repaired with BOTH of the
pod's addresses (the request reaches host-local as the `ips` capability or `args.cni.ips`, never
as CNI_ARGS `IP=a,b`, which host-local refuses on every verb); the pod's DEL afterwards, and the
DEL of an attachment an older nri-cni cached with `IP=a,b`, succeed; a DEL that keeps failing is
reported by name (broken "del-failed") and forgotten once GC releases the pod."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import PodError
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import BrokenCode, PodState
from tests.support.bin_dir import install_plugin, python_script
from tests.support.harness import new_pod_id
from tests.support.netns import get_link
from tests.support.pods import pod_plan, pod_service

pytestmark = pytest.mark.netns

V4 = "10.244.62.0/24"
V6 = "fd00:244:62::/64"

# the chain's last plugin: its DEL fails while the flag file exists (a DEL that keeps failing)
DEL_GATE = """
import json, os, sys
conf = json.loads(sys.stdin.read() or "{}")
cmd = os.environ.get("CNI_COMMAND")
if cmd == "DEL" and os.path.exists(conf["failFile"]):
    print(json.dumps({"cniVersion": conf["cniVersion"], "code": 101, "msg": "del gate closed"}))
    sys.exit(1)
if cmd in ("ADD", "CHECK") and "prevResult" in conf and cmd == "ADD":
    print(json.dumps(conf["prevResult"]))
elif cmd == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
"""


class DualWorld:
    """A pod service (shim mode) over one bridge network with the given host-local ranges."""

    def __init__(self, node, subnets: list[str], *, ips_capability: bool = False, del_gate: bool = False):
        self.node = node
        conflist = node.bridge_net("podnet", subnets[0])
        plugin = conflist["plugins"][0]
        plugin["ipam"]["ranges"] = [[{"subnet": s}] for s in subnets]
        if ips_capability:
            plugin["capabilities"] = {"ips": True}
        self.bridge = plugin["bridge"]
        self.gate = node.tmp / "del-gate-closed"
        if del_gate:
            install_plugin(node.bin_dir, "delgate", python_script(DEL_GATE))
            conflist["plugins"].append({"type": "delgate", "failFile": str(self.gate)})
        doc = node.config("shim", [{"name": "podnet", "default": True, "conflist": conflist}])
        self.cfg = parse_config(doc, str(node.tmp / "config.yaml"))
        self.cni = CNIRuntime(
            [str(node.bin_dir)], self.cfg.cni.cache_dir, exec_timeout=20, executor=PluginExecutor()
        )
        self.svc = pod_service(self.cfg, pod_plan(self.cfg, self.cni), mode=mode_for(self.cfg))
        self.ns: dict[str, object] = {}
        self.pods: list[PodInfo] = []

    def pod(self) -> PodInfo:
        ns = self.node.jan.netns()
        pod = PodInfo(new_pod_id(), name=f"d{len(self.pods)}", namespace="default", netns=ns.path)
        self.ns[pod.id] = ns
        self.pods.append(pod)
        return pod

    async def attach(self, pod: PodInfo) -> PodInfo:
        """The shim's ADD; returns the pod as the runtime then lists it (with every IP)."""
        answer = await self.svc.verbs.attach(pod)
        return PodInfo(pod.id, pod.name, pod.namespace, pod.uid, pod.netns, {}, tuple(answer.ips()))

    def addrs(self, pod: PodInfo) -> list[str]:
        """eth0's global addresses, plain, sorted (link-local IPv6 left out)."""
        link = get_link("eth0", self.ns[pod.id])
        if link is None:
            return []
        plain = [a.split("/")[0] for a in link.addrs]
        return sorted(a for a in plain if not a.startswith("fe80:"))

    def reaches(self, src: PodInfo, ip: str) -> bool:
        return self.ns[src.id].run("ping", "-c", "1", "-W", "2", ip, check=False).returncode == 0

    async def teardown(self) -> None:
        self.gate.unlink(missing_ok=True)
        for pod in self.pods:
            await self.svc.verbs.detach(pod)
        await self.svc.close()
        assert self.node.reservations() == [], "an IP leaked"
        assert self.svc.view.attachments() == [], "a cache entry leaked"


def records(caplog, op: str) -> list[dict]:
    out = [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]
    return [r for r in out if r["op"] == op]


@pytest.fixture
def podop_log(caplog):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")
    caplog.set_level(logging.INFO, logger="nri_cni.daemon")
    return caplog


def family(ips, v6: bool) -> list[str]:
    return [ip for ip in ips if (":" in ip) == v6]


async def wait_reaches(w: DualWorld, src: PodInfo, ip: str) -> bool:
    """Pings until the first answer, for up to ~60 s: IPv6 needs DAD on both ends first, and a
    peer's neighbour entry for a re-made eth0 (a new MAC) takes its NUD probes (~10 s) to fail
    over."""
    for _ in range(30):
        if await asyncio.to_thread(w.reaches, src, ip):
            return True
    return False


@pytest.mark.parametrize("ips_capability", [False, True], ids=["args-cni-ips", "ips-capability"])
def test_a_flushed_ipv6_address_is_repaired_with_both_of_the_pods_addresses(node, podop_log, ips_capability):
    w = DualWorld(node, [V4, V6], ips_capability=ips_capability)

    async def scenario():
        a, b = await asyncio.to_thread(w.pod), await asyncio.to_thread(w.pod)
        a, b = await w.attach(a), await w.attach(b)
        for p in (a, b):  # one address of each family, answered and on eth0
            assert len(family(p.ips, False)) == 1 and len(family(p.ips, True)) == 1, p.ips
            assert await asyncio.to_thread(w.addrs, p) == sorted(p.ips)
        a6, b6 = family(a.ips, True)[0], family(b.ips, True)[0]
        assert await wait_reaches(w, a, b6) and await wait_reaches(w, b, a6)
        w.svc.roster.listed([a, b])
        assert {h.pod_id: h.state for h in await w.svc.timers.verify()} == {
            a.id: PodState.OK,
            b.id: PodState.OK,
        }
        veth_b = (await asyncio.to_thread(get_link, "eth0", w.ns[b.id])).index

        await asyncio.to_thread(w.ns[a.id].run, "ip", "-6", "addr", "flush", "dev", "eth0", "scope", "global")
        assert await asyncio.to_thread(w.addrs, a) == family(a.ips, False)
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        assert verdicts[a.id].state is PodState.REPAIRED, verdicts[a.id].to_dict()
        assert verdicts[b.id].state is PodState.OK  # the intact pod is left alone
        assert (await asyncio.to_thread(get_link, "eth0", w.ns[b.id])).index == veth_b
        assert await asyncio.to_thread(w.addrs, a) == sorted(a.ips)  # both families, the same IPs
        (record,) = records(podop_log, "repair")
        assert record["result"] == "ok" and sorted(record["asked"]["podnet/eth0"]) == sorted(a.ips)
        assert await wait_reaches(w, b, a6) and await wait_reaches(w, b, family(a.ips, False)[0])
        again = {h.pod_id: h for h in await w.svc.timers.verify(a.id, check=True)}
        assert [v.finding for v in again[a.id].attachments] == ["ok"]
        # the pod's DEL after the repair carries no request: it succeeds, the leases go
        await w.svc.verbs.detach(a)
        assert sorted((r.ip, r.container_id) for r in node.reservations()) == sorted(
            (ip, b.id) for ip in b.ips
        )
        await w.teardown()

    asyncio.run(scenario())


def test_an_ipv6_only_pod_whose_eth0_was_deleted_gets_its_address_back(node, podop_log):
    w = DualWorld(node, [V6])

    async def scenario():
        a, b = await asyncio.to_thread(w.pod), await asyncio.to_thread(w.pod)
        a, b = await w.attach(a), await w.attach(b)
        assert len(a.ips) == 1 and ":" in a.ips[0]
        w.svc.roster.listed([a, b])
        await asyncio.to_thread(w.ns[a.id].run, "ip", "link", "del", "eth0")
        verdicts = {h.pod_id: h.state for h in await w.svc.timers.verify()}
        assert verdicts == {a.id: PodState.REPAIRED, b.id: PodState.OK}
        assert await asyncio.to_thread(w.addrs, a) == list(a.ips)
        assert await wait_reaches(w, b, a.ips[0])
        await w.teardown()

    asyncio.run(scenario())


def test_the_del_of_an_entry_cached_with_cni_args_ip_list_succeeds(node, podop_log):
    """What an older nri-cni's dual-stack repair left: CNI_ARGS `IP=v4,v6` in the cache entry.
    host-local parses CNI_ARGS on DEL too: with it, every stop of the pod failed for ever."""
    w = DualWorld(node, [V4, V6])

    async def scenario():
        a = await w.attach(await asyncio.to_thread(w.pod))
        (entry,) = w.svc.view.attachments(a.id)
        cached = json.loads(open(entry.path).read())
        cached["cniArgs"] = [*cached.get("cniArgs", []), ["IP", ",".join(a.ips)]]
        with open(entry.path, "w") as f:
            json.dump(cached, f)
        await w.svc.verbs.detach(a)  # raised PodError ("invalid IP address") before
        assert node.reservations() == [] and w.svc.view.attachments() == []
        await w.teardown()

    asyncio.run(scenario())


def test_a_del_that_keeps_failing_is_reported_by_name_until_gc_releases_the_pod(node, podop_log):
    w = DualWorld(node, [V4], del_gate=True)

    async def scenario():
        a = await w.attach(await asyncio.to_thread(w.pod))
        w.svc.roster.listed([a])
        w.gate.touch()
        with pytest.raises(PodError, match="del gate closed"):
            await w.svc.verbs.detach(a)  # the runtime's stop
        with pytest.raises(PodError, match="del gate closed"):
            await w.svc.verbs.remove(a)  # its remove: the pod leaves the runtime's list
        health = w.svc.health.get(a.id)
        assert health is not None and health.code is BrokenCode.DEL_FAILED, w.svc.health.all()
        assert "del gate closed" in health.reason and health.state is PodState.BROKEN
        w.svc.roster.listed([])
        await w.svc.timers.gc("test")  # GC retries, fails again: still reported
        assert w.svc.health.get(a.id).code is BrokenCode.DEL_FAILED
        w.gate.unlink()
        report = await w.svc.timers.gc("test")
        assert report["errors"] == [] and w.svc.health.get(a.id) is None
        assert node.reservations() == [] and w.svc.view.attachments() == []
        await w.teardown()

    asyncio.run(scenario())
