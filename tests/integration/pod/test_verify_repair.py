"""Verify and repair through the pod service, with the real bridge + host-local
plugins in namespaces the test made: each kind of external damage is found and repaired with
the same IP; a pod whose IP another pod holds, a repair that keeps failing, `repair:
verify-only` and native mode's missed pods are reported broken, with the reason, untouched."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import NriCniError
from nri_cni.pod.model import AttachRequest, PodInfo
from nri_cni.service.modes import mode_for
from nri_cni.service.podstate import BrokenCode, PodState
from nri_cni.service.service import PodService
from tests.support.bin_dir import install_plugin, python_script
from tests.support.harness import new_pod_id
from tests.support.netns import delete_link, get_link
from tests.support.pods import pod_plan, pod_service

pytestmark = pytest.mark.netns

SUBNET = "10.244.61.0/24"

# a chain's last plugin that fails every ADD while its flag file exists (a plugin that keeps failing)
GATE = """
import json, os, sys
conf = json.loads(sys.stdin.read() or "{}")
cmd = os.environ.get("CNI_COMMAND")
if cmd == "ADD":
    if os.path.exists(conf["failFile"]):
        print(json.dumps({"cniVersion": conf["cniVersion"], "code": 100, "msg": "gate closed"}))
        sys.exit(1)
    print(json.dumps(conf["prevResult"]))
elif cmd == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
"""


class World:
    """A pod service over one bridge network (shim mode unless told), and its pods."""

    def __init__(self, node, mode: str = "shim", *, gate: bool = False, **extra) -> None:
        self.node = node
        conflist = node.bridge_net("podnet", SUBNET)
        self.bridge = conflist["plugins"][0]["bridge"]
        self.fail_file = node.tmp / "gate-closed"
        if gate:
            install_plugin(node.bin_dir, "gate", python_script(GATE))
            conflist["plugins"].append({"type": "gate", "failFile": str(self.fail_file)})
        networks = [{"name": "podnet", "default": True, "conflist": conflist}]
        if mode == "secondary":  # the runtime's own eth0 (not made here); podnet is an extra
            networks[0]["interface"] = "net1"
            extra.setdefault("primary_network", "runtimenet")
        if mode == "native":
            extra.setdefault("primary_network", "podnet")
        doc = node.config(mode, networks, **extra)
        doc["cni"]["runtime_cache_dir"] = str(node.tmp / "runtime-cache")  # secondary mode reads it
        self.cfg = parse_config(doc, str(node.tmp / "config.yaml"))
        self.cni = CNIRuntime(
            [str(node.bin_dir)], self.cfg.cni.cache_dir, exec_timeout=20, executor=PluginExecutor()
        )
        self.svc = pod_service(self.cfg, pod_plan(self.cfg, self.cni), mode=mode_for(self.cfg))
        self.pods: list[PodInfo] = []

    def pod(self, **kw) -> PodInfo:
        ns = self.node.jan.netns()
        pod = PodInfo(new_pod_id(), name=f"p{len(self.pods)}", namespace="default", netns=ns.path, **kw)
        NS[pod.netns] = ns
        self.pods.append(pod)
        return pod

    async def attach(self, pod: PodInfo, request: AttachRequest | None = None) -> str:
        """The shim's ADD; returns the pod's IP (plain)."""
        answer = await self.svc.verbs.attach(pod, request)
        return answer.ips()[0]

    def listed(self, *pods: PodInfo) -> None:
        """The runtime's pod list (as Synchronize brings it), without the background work."""
        self.svc.roster.listed(list(pods))

    async def teardown(self) -> None:
        self.fail_file.unlink(missing_ok=True)
        for pod in self.pods:
            await self.svc.verbs.detach(pod)
        await self.svc.close()
        assert self.node.reservations() == [], "an IP leaked"
        assert self.svc.view.attachments() == [], "a cache entry leaked"


NS: dict = {}  # netns path -> the test's Netns


def ns_of(pod: PodInfo):
    return NS[pod.netns]


def listed_as(pod: PodInfo, *ips: str) -> PodInfo:
    """The pod as the runtime lists it, reporting `ips` (PodSandbox.ips)."""
    return PodInfo(pod.id, pod.name, pod.namespace, pod.uid, pod.netns, dict(pod.annotations), tuple(ips))


def eth0_addrs(pod, ifname: str = "eth0") -> list[str]:
    link = get_link(ifname, ns_of(pod))
    return [] if link is None else [a.split("/")[0] for a in link.addrs if "." in a]  # IPv4 only


async def addrs(pod, ifname: str = "eth0") -> list[str]:
    return await asyncio.to_thread(eth0_addrs, pod, ifname)


def host_veth(svc: PodService, pod: PodInfo, bridge: str) -> str:
    (entry,) = svc.view.attachments(pod.id)
    return next(i["name"] for i in entry.result["interfaces"] if not i.get("sandbox") and i["name"] != bridge)


def reaches(src, ip: str) -> bool:
    return ns_of(src).run("ping", "-c", "1", "-W", "2", ip, check=False).returncode == 0


def repair_records(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "nri_cni.podop"]


@pytest.fixture
def podop_log(caplog):
    caplog.set_level(logging.INFO, logger="nri_cni.podop")
    caplog.set_level(logging.INFO, logger="nri_cni.daemon")
    return caplog


DAMAGE = {
    "eth0-deleted": lambda w, pod: ns_of(pod).run("ip", "link", "del", "eth0"),
    "host-veth-deleted": lambda w, pod: delete_link(host_veth(w.svc, pod, w.bridge)),
    "address-flushed": lambda w, pod: ns_of(pod).run("ip", "addr", "flush", "dev", "eth0"),
    "bridge-deleted": lambda w, pod: delete_link(w.bridge),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_external_damage_is_repaired_with_the_same_ip(node, podop_log, damage):
    w = World(node)

    async def scenario():
        a, b = await asyncio.to_thread(w.pod), await asyncio.to_thread(w.pod)
        ip_a, ip_b = await w.attach(a), await w.attach(b)
        a, b = listed_as(a, ip_a), listed_as(b, ip_b)
        w.listed(a, b)
        first = {h.pod_id: h.state for h in await w.svc.timers.verify()}
        assert first == {a.id: PodState.OK, b.id: PodState.OK}
        mac_before = (await asyncio.to_thread(get_link, "eth0", ns_of(a))).mac

        await asyncio.to_thread(DAMAGE[damage], w, a)
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        health = verdicts[a.id]
        assert health.state is PodState.REPAIRED, health.to_dict()
        assert health.repairs == 1 and health.reason
        assert await addrs(a) == [ip_a]  # the same IP, whatever the MAC
        # the bridge is every pod's: both are repaired; else only the damaged one
        expected_b = PodState.REPAIRED if damage == "bridge-deleted" else PodState.OK
        assert verdicts[b.id].state is expected_b
        link = await asyncio.to_thread(get_link, "eth0", ns_of(a))
        assert link is not None and link.up
        if damage in ("eth0-deleted", "host-veth-deleted"):
            assert link.mac != mac_before  # made again: only the IP is the pod's
        bridge = await asyncio.to_thread(get_link, w.bridge)
        assert bridge is not None
        veth = await asyncio.to_thread(get_link, host_veth(w.svc, a, w.bridge))
        assert veth.master == bridge.index
        assert await asyncio.to_thread(reaches, b, ip_a) and await asyncio.to_thread(reaches, a, ip_b)
        (record,) = [r for r in repair_records(podop_log) if r["op"] == "repair" and r["podId"] == a.id]
        assert record["podId"] == a.id and record["result"] == "ok"
        assert record["wrong"] and record["asked"] == {"podnet/eth0": [ip_a]}  # the runtime's
        assert [(s["network"], s["op"]) for s in record["networks"]] == [("podnet", "del"), ("podnet", "add")]
        # the next round finds it true (and it stays "repaired", with its count)
        again = {h.pod_id: h for h in await w.svc.timers.verify(a.id, check=True)}
        assert again[a.id].state is PodState.REPAIRED and again[a.id].repairs == 1
        assert [v.finding for v in again[a.id].attachments] == ["ok"]
        await w.teardown()

    asyncio.run(scenario())


def test_pod_listed_with_the_runtimes_ip_and_no_attachment_gets_that_ip(node, podop_log):
    """Shim mode, containerd restarted during the ADD: the runtime lists the pod READY with
    the IP of an ADD that is gone (rolled back, released). Verify ADDs it asking for that IP."""
    w = World(node)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        await w.svc.verbs.detach(pod)  # the cut ADD's undoing: no eth0, the IP released
        assert await addrs(pod) == [] and node.reservations() == []
        listed = listed_as(pod, ip)
        w.listed(listed)
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.REPAIRED, health.to_dict()
        assert await addrs(pod) == [ip]
        assert [r.ip for r in node.reservations()] == [ip]
        await w.teardown()

    asyncio.run(scenario())


def test_runtimes_ip_held_by_another_pod_is_never_taken(node, podop_log):
    w = World(node)
    now = [1000.0]
    w.svc.verifier.clock = lambda: now[0]

    async def scenario():
        victim = await asyncio.to_thread(w.pod)
        ip = await w.attach(victim)
        await w.svc.verbs.detach(victim)
        # on purpose: another pod gets that very IP meanwhile
        holder = await asyncio.to_thread(w.pod)
        assert await w.attach(holder, AttachRequest(ips={("podnet", "eth0"): (ip,)})) == ip
        w.listed(listed_as(victim, ip), listed_as(holder, ip))
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        broken = verdicts[victim.id]
        assert broken.state is PodState.BROKEN and broken.code is BrokenCode.IP_TAKEN, broken.to_dict()
        assert ip in broken.reason and holder.id[:12] in broken.reason
        assert verdicts[holder.id].state is PodState.OK
        assert await addrs(victim) == [] and await addrs(holder) == [ip]
        assert [r.container_id for r in node.reservations()] == [holder.id]
        lines = [r.getMessage() for r in podop_log.records if "is broken (ip-taken)" in r.getMessage()]
        assert len(lines) == 1 and victim.id in lines[0]
        await w.svc.timers.verify()  # still broken: no second log line
        lines = [r.getMessage() for r in podop_log.records if "is broken (ip-taken)" in r.getMessage()]
        assert len(lines) == 1
        # the holder goes: after its backoff the victim gets its own IP back
        await w.svc.verbs.remove(listed_as(holder, ip))
        w.listed(listed_as(victim, ip))
        now[0] += 10_000
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.REPAIRED and await addrs(victim) == [ip]
        await w.teardown()

    asyncio.run(scenario())


def test_a_repair_that_keeps_failing_backs_off_then_is_broken(node, podop_log):
    w = World(node, gate=True)
    now = [1000.0]
    w.svc.verifier.clock = lambda: now[0]

    def gate_calls() -> int:
        return sum(
            1 for r in podop_log.records if r.name == "nri_cni.podop" and '"op":"repair"' in r.getMessage()
        )

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        w.listed(listed_as(pod, ip))
        await asyncio.to_thread(ns_of(pod).run, "ip", "link", "del", "eth0")
        w.fail_file.touch()
        states = []
        # seconds the clock moves before each round: the backoff is 1 s after the first failure, 2 s after the second
        for step in (0, 0, 1, 0, 2, 0):
            now[0] += step
            (health,) = await w.svc.timers.verify() or [None]
            states.append((gate_calls(), health.state.value if health else None))
        # tries at rounds 1, 3 and 5 (each after its backoff), none while backing off
        assert [n for n, _ in states] == [1, 1, 2, 2, 3, 3], states
        assert states[-1][1] == "broken"
        health = w.svc.health.get(pod.id)
        assert health.code is BrokenCode.REPAIR_FAILED and "gate closed" in health.reason
        assert node.reservations() == [] and w.svc.view.attachments(pod.id) == []  # every try rolled back
        # the plugin recovers: the next try (after its backoff) repairs it with the same IP
        w.fail_file.unlink()
        now[0] += 10_000
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.REPAIRED and await addrs(pod) == [ip]
        await w.teardown()

    asyncio.run(scenario())


@pytest.mark.parametrize("setting", ["verify-only", "off"])
def test_verify_only_reports_and_touches_nothing(node, podop_log, setting):
    w = World(node, repair=setting)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        w.listed(listed_as(pod, ip))
        await asyncio.to_thread(ns_of(pod).run, "ip", "addr", "flush", "dev", "eth0")
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.BROKEN and health.code is BrokenCode.REPAIR_OFF
        assert "lacks" in health.reason and f"repair is {setting}" in health.reason
        assert await addrs(pod) == []
        assert [v.finding for v in health.attachments] == ["address-missing"]
        assert not [r for r in repair_records(podop_log) if r["op"] == "repair"]
        await w.teardown()

    asyncio.run(scenario())


def test_native_mode_reports_missed_pods_and_attaches_nothing_behind_the_runtime(node, podop_log):
    w = World(node, "native")

    async def scenario():
        down = await asyncio.to_thread(w.pod)  # created while nri-cni was down: nothing of nri-cni's
        late = await asyncio.to_thread(
            w.pod
        )  # attached, but the runtime never took the answer (past its deadline)
        await w.attach(late)
        good = await asyncio.to_thread(w.pod)
        good_ip = await w.attach(good)
        w.listed(listed_as(down), listed_as(late), listed_as(good, good_ip))
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        for pod in (down, late):
            health = verdicts[pod.id]
            assert health.state is PodState.BROKEN and health.code is BrokenCode.MISSED, health.to_dict()
            assert "delete the pod" in health.reason
        assert "without nri-cni's answer" in verdicts[down.id].reason
        assert "did not take nri-cni's answer" in verdicts[late.id].reason
        assert w.svc.view.attachments(down.id) == [] and await addrs(down) == []
        assert verdicts[good.id].state is PodState.OK
        # damage to a pod the runtime knows the IPs of is repaired, with those IPs
        await asyncio.to_thread(ns_of(good).run, "ip", "link", "del", "eth0")
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        assert verdicts[good.id].state is PodState.REPAIRED and await addrs(good) == [good_ip]
        await w.teardown()

    asyncio.run(scenario())


def test_secondary_mode_repairs_extra_networks_and_attaches_missing_ones(node, podop_log):
    w = World(node, "secondary")

    async def scenario():
        attached, missed = await asyncio.to_thread(w.pod), await asyncio.to_thread(w.pod)
        ip = (await w.svc.verbs.attach(attached)).ips()[0]
        await asyncio.to_thread(ns_of(attached).run, "ip", "link", "del", "net1")
        w.listed(attached, missed)  # the runtime reports its own network's IPs: none here
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        assert verdicts[attached.id].state is PodState.REPAIRED, verdicts[attached.id].to_dict()
        assert await addrs(attached, "net1") == [ip]
        # nri-cni was down when `missed` started: its extra network is attached now
        assert verdicts[missed.id].state is PodState.REPAIRED, verdicts[missed.id].to_dict()
        assert "podnet/net1: not attached" in verdicts[missed.id].reason
        assert len(await addrs(missed, "net1")) == 1
        await w.teardown()

    asyncio.run(scenario())


def test_synchronize_runs_gc_then_verify(node, podop_log):
    w = World(node)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        await asyncio.to_thread(ns_of(pod).run, "ip", "link", "del", "eth0")
        w.svc.timers.synchronized([listed_as(pod, ip)])
        while w.svc.timers.background():  # GC, then the verify round (a hang: pytest's timeout)
            await asyncio.sleep(0.02)
        assert w.svc.health.rounds == 1
        assert w.svc.health.get(pod.id).state is PodState.REPAIRED
        assert await addrs(pod) == [ip]
        with pytest.raises(NriCniError):
            await w.svc.timers.verify("no-such-pod")
        await w.teardown()

    asyncio.run(scenario())


def test_a_pod_the_runtime_tore_down_is_never_attached_again(node, podop_log):
    """NRI stop (or the runtime's CNI DEL) detaches the pod; its netns lingers until the runtime
    removes it. Verify must not take the missing attachment for damage and ADD it again."""
    w = World(node)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        listed = listed_as(pod, ip)
        w.listed(listed)
        await w.svc.verbs.detach(listed)
        assert await w.svc.timers.verify() == []
        assert await w.svc.timers.verify(pod.id) == []
        assert w.svc.view.attachments(pod.id) == [] and node.reservations() == []
        # listed again by a Synchronize (the runtime says it runs): verify's business again
        w.listed(listed)
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.REPAIRED and await addrs(pod) == [ip]
        await w.teardown()

    asyncio.run(scenario())


def test_an_ip_the_ipam_refuses_is_reported_taken(node, podop_log):
    """No cache entry of nri-cni's holds the address, but host-local has it reserved for someone
    else (another runtime's attachment): the ADD asking for it fails naming it -> ip-taken."""
    w = World(node)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        ip = await w.attach(pod)
        await w.svc.verbs.detach(pod)
        (reserved_dir,) = [d for d in node.ipam_dir.iterdir() if d.is_dir()]
        outsider = reserved_dir / ip
        outsider.write_text("someone-else\r\neth0")
        try:
            w.listed(listed_as(pod, ip))
            (health,) = await w.svc.timers.verify()
            assert health.state is PodState.BROKEN and health.code is BrokenCode.IP_TAKEN, health.to_dict()
            assert f"the IPAM refused its address {ip}" in health.reason
            assert await addrs(pod) == [] and w.svc.view.attachments(pod.id) == []
        finally:
            outsider.unlink()
        await w.teardown()

    asyncio.run(scenario())


def test_native_pod_answered_through_run_pod_sandbox_is_verified_against_the_answer(node, podop_log):
    """RunPodSandbox's PodSandbox carries no IPs (the runtime learns them from the answer): until
    a Synchronize says otherwise, the pod is judged against what nri-cni answered, not missed."""
    w = World(node, "native")

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        w.svc.verbs.seen(pod)  # the RunPodSandbox event, before the attach
        ip = await w.attach(pod)
        assert (listed := w.svc.roster.record(pod.id).pod) is not None and listed.ips == (ip,)
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.OK, health.to_dict()
        await asyncio.to_thread(ns_of(pod).run, "ip", "addr", "flush", "dev", "eth0")
        (health,) = await w.svc.timers.verify()
        assert health.state is PodState.REPAIRED and await addrs(pod) == [ip]
        await w.teardown()

    asyncio.run(scenario())


def test_a_bridge_mac_that_changed_is_no_damage(node, podop_log):
    """A bridge without a fixed MAC takes its lowest port's, so it changes as pods come and go
    (plugins#60); the bridge plugin's CHECK with the cached result would call every older pod
    damaged, and a repair would cut its network for nothing. Such a pod stays ok, untouched."""
    w = World(node)

    async def scenario():
        a = await asyncio.to_thread(w.pod)
        a = listed_as(a, await w.attach(a))
        w.listed(a)
        bridge = await asyncio.to_thread(get_link, w.bridge)
        set_mac = ["ip", "link", "set", w.bridge, "address", "02:00:00:00:00:01"]
        await asyncio.to_thread(subprocess.run, set_mac, check=True)
        assert (await asyncio.to_thread(get_link, w.bridge)).mac != bridge.mac
        (health,) = await w.svc.timers.verify(a.id, check=True)
        assert health.state is PodState.OK, health.to_dict()
        assert [r for r in repair_records(podop_log) if r["op"] == "repair"] == []
        await w.teardown()

    asyncio.run(scenario())


def test_shim_pod_the_runtime_deleted_and_lists_again_without_an_ip_is_reported_torn_down(node, podop_log):
    """CRI-O killed or stopped in the middle of a StopPodSandbox: its CNI DEL (through the shim)
    ran, then, restarted, it lists the pod READY again, with no IP. Attaching it anew would give
    it an IP the runtime never reports: reported broken `torn-down`, nothing attached. A pod never
    attached and listed without an IP (in creation) stays unjudged."""
    w = World(node)

    async def scenario():
        cut = await asyncio.to_thread(w.pod)
        ip = await w.attach(cut)
        w.listed(listed_as(cut, ip))
        await w.svc.verbs.detach(cut)  # the runtime's CNI DEL
        fresh = await asyncio.to_thread(w.pod)  # listed, not attached yet
        w.listed(listed_as(cut), listed_as(fresh))  # after the runtime's restart
        verdicts = {h.pod_id: h for h in await w.svc.timers.verify()}
        health = verdicts[cut.id]
        assert health.state is PodState.BROKEN and health.code is BrokenCode.TORN_DOWN, health.to_dict()
        assert "lists it READY without an IP" in health.reason
        assert fresh.id not in verdicts
        assert w.svc.view.attachments(cut.id) == [] and await addrs(cut) == []
        assert not [r for r in repair_records(podop_log) if r["op"] == "repair"]
        # listed again in a later Synchronize, it is still what it was; removed, it is forgotten
        w.listed(listed_as(cut), listed_as(fresh))
        assert {h.pod_id: h.code for h in await w.svc.timers.verify()} == {cut.id: BrokenCode.TORN_DOWN}
        await w.svc.verbs.remove(cut)
        w.listed(listed_as(fresh))
        assert not w.svc.roster.record(cut.id).relisted and w.svc.health.get(cut.id) is None
        await w.teardown()

    asyncio.run(scenario())


def test_a_runtimes_check_is_an_operation_of_its_own(node, podop_log):
    """CRI-O runs CNI CHECK (through the shim) right after each ADD and of every pod at its
    start: one `check` record with each network's step. The one right after the ADD is
    answered from the records once netlink shows the real pod as its result says (no plugin
    call); the next one runs the plugins' CHECK, whose calls its record takes (and the next
    operation's record does not list: e2e on CRI-O)."""
    w = World(node)

    async def scenario():
        pod = await asyncio.to_thread(w.pod)
        await w.attach(pod)
        await w.svc.verbs.check(pod)
        await w.svc.verbs.check(pod)
        await w.svc.verbs.detach(pod)
        ops = [r for r in repair_records(podop_log) if r["podId"] == pod.id]
        assert [r["op"] for r in ops] == ["add", "check", "check", "del"]
        first, second = ops[1:3]
        for check in (first, second):
            assert [(n["network"], n["ifname"], n["op"]) for n in check["networks"]] == [
                ("podnet", "eth0", "check")
            ]
            assert check["result"] == "ok"
        assert (first["from"], first["plugins"]) == ("records", [])
        assert second["from"] == "plugins" and {p["command"] for p in second["plugins"]} == {"CHECK"}
        assert ops[3]["networks"][0]["op"] == "del"
        await w.svc.verbs.check(pod)  # nothing of the pod's left: no record
        assert sum(r["op"] == "check" for r in repair_records(podop_log)) == 2
        await w.teardown()

    asyncio.run(scenario())
