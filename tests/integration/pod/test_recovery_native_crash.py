"""kill -9 of nri-cni from outside, NRI-native mode: nri-cni runs as a real process against the
runtime-side NRI test double; the block plugin (tests/plugins/block_plugin.py) holds a plugin of
an ADD, a FINALIZE, a DEL, a GC or a rollback, or the start-up recovery's DEL, while the test
kills nri-cni by PID. The double then does what a runtime does when a plugin's connection dies:
a creation fails and its netns goes; a stop goes on without the plugin (the netns goes, then the
pod). nri-cni is started again; after its Synchronize every pod the runtime lists has exactly its
networks with the IPs the runtime took from nri-cni's answer (netlink), and nothing else is
left: reservations, host veths, bridge ports, firewall rules, cache files, intent records.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from nri_cni.api import nri_pb2
from nri_cni.errors import Unavailable
from nri_cni.local.codec import LocalProtocolError
from tests.plugins.block_plugin import BlockControl, Blocked
from tests.support.bin_dir import install_test_plugin
from tests.support.damage import damage_left
from tests.support.faultnode import broken_by_name
from tests.support.harness import new_pod_id, pod_message, run
from tests.support.netns import delete_link, delete_netns, list_links
from tests.support.nri_runtime import NriRuntime
from tests.support.nricni import NriCni
from tests.support.podtruth import RuntimePod, pod_interfaces, whole_problems
from tests.support.recovery_node import install_ctl, wait_settled

pytestmark = pytest.mark.netns

KINDS = ["add", "add-kept", "finalize", "rollback", "del", "gc", "recovery", "repair"]
BLOCKS = {  # kind -> (network, where the block plugin goes, the commands it holds)
    "add": ("plugins", ["ADD"]),
    "add-kept": ("plugins", ["ADD"]),
    "finalize": ("finalize_plugins", ["FINALIZE"]),
    "rollback": ("plugins", ["DEL"]),
    "del": ("plugins", ["DEL"]),
    "gc": ("plugins", ["GC"]),
    "recovery": ("plugins", ["ADD", "DEL"]),
    "repair": ("plugins", ["ADD"]),
}


def _networks(node, block: BlockControl, kind: str) -> list[dict]:
    master, _ = node.jan.veth()
    eth0 = node.bridge_net("podnet", "10.244.70.0/24")
    eth0["finalize_plugins"] = [node.fake("fake-finalize")]
    where, commands = BLOCKS[kind]
    eth0[where].append({"type": "block", "block": block.config(armed=True, commands=commands)})
    if kind == "rollback":  # refuses the ADD while its control file says so
        eth0["plugins"].append({"type": "ctl", "control": str(node.tmp / "ctl")})
    return [
        {"name": "podnet", "default": True, "conflist": eth0},
        {
            "name": "fastnet",
            "default": True,
            "conflist": node.macvlan_net("fastnet", "10.244.71.0/24", master),
        },
    ]


class NativeScene:
    """The double, nri-cni as a process, a survivor pod and the leak baseline."""

    def __init__(self, node, kind: str) -> None:
        self.node = node
        install_test_plugin(node.bin_dir, "block_plugin", "block")
        install_ctl(node.bin_dir)
        (node.tmp / "ctl").mkdir()
        self.block = BlockControl(node.tmp / "block")
        extra = {"verify": {"interval": "1s"}} if kind == "repair" else {}
        self.cfg = node.config("native", _networks(node, self.block, kind), **extra)
        self.bridge = self.cfg["networks"][0]["conflist"]["plugins"][0]["bridge"]
        self.runtime = NriRuntime(
            self.cfg["nri"]["socket"],
            runtime_name="nri-test-double",
            runtime_version="1.0.0",
            request_timeout_ms=20000,
        )
        self.daemon = NriCni(node.tmp, self.cfg)
        self.connections = 0
        self.ns_survivor = node.jan.netns()
        self.survivor = pod_message(new_pod_id(), self.ns_survivor.path, name="survivor")
        self.checker = None

    async def start_daemon(self) -> None:
        """Starts nri-cni (again) and waits until the work its Synchronize started is done."""
        self.connections += 1
        log = self.daemon.log_path
        mark = log.stat().st_size if log.exists() else 0
        await asyncio.to_thread(self.daemon.start)
        await self.runtime.wait_plugin(self.connections)
        await asyncio.to_thread(wait_settled, self.daemon, mark)

    async def create(self, pod: nri_pb2.PodSandbox) -> None:
        """RunPodSandbox; the runtime keeps the IPs of nri-cni's answer (PR #295's shape)."""
        resp = await self.runtime.run_pod_sandbox(pod)
        pod.ips.extend(resp.adjust.network.ips)
        self.runtime.pods.append(pod)

    async def begin(self) -> None:
        await self.runtime.start()
        await self.start_daemon()
        await self.create(self.survivor)
        # the survivor's state is the baseline (pyroute2: never on the running loop)
        self.checker = await asyncio.to_thread(lambda: self.node.leak_checker().start())

    async def wait_blocked(self, command: str, pod_id: str | None = None) -> Blocked:
        return await asyncio.to_thread(self.block.wait_blocked, command, pod_id)

    async def kill_while_blocked(self, blocked: Blocked) -> None:
        assert blocked.ppid == self.daemon.proc.pid  # nri-cni runs it
        await asyncio.to_thread(self.daemon.kill9)
        assert self.daemon.proc.returncode == -signal.SIGKILL
        assert blocked.alive()  # the plugin outlived the daemon, and ends into a dead pipe
        self.block.disarm()
        self.block.release(blocked)

    async def assert_truth(self, gone: str) -> None:
        node = self.node
        problems = []
        for pod in self.runtime.pods:
            netns = pod.linux.namespaces[0].path
            rp = RuntimePod(pod.id, netns, tuple(pod.ips))
            problems += await asyncio.to_thread(whole_problems, rp, ["eth0", "net1"])
        assert problems == []
        assert [p.id for p in self.runtime.pods] == [self.survivor.id]
        assert [r for r in node.reservations() if r.container_id == gone] == []
        assert sorted(r.ifname for r in node.reservations()) == ["eth0", "net1"]
        assert not [f for f in node.cache_dir.glob("results/*") if gone in f.name]
        assert list((node.state_dir / "intents").iterdir()) == []
        assert await asyncio.to_thread(self.checker.leaks) == []
        # attached once: the restart found it whole
        ops = await asyncio.to_thread(self.daemon.op_lines)
        assert [op["op"] for op in ops if op["podId"] == self.survivor.id] == ["add"]
        await self.runtime.stop_pod_sandbox(self.survivor)
        await self.runtime.remove_pod_sandbox(self.survivor)
        assert node.reservations() == []
        assert list(node.cache_dir.glob("results/*")) == []

    async def end(self) -> None:
        self.block.disarm()
        self.block.release_all()
        await asyncio.to_thread(self.daemon.stop)
        await self.runtime.stop()


async def _creation_cut(scene: NativeScene, command: str, victim, ns_victim) -> None:
    """RunPodSandbox of `victim` while nri-cni dies in `command`: it fails, the runtime drops
    the pod and its netns."""
    scene.block.arm()
    creation = asyncio.create_task(scene.runtime.run_pod_sandbox(victim))
    blocked = await scene.wait_blocked(command, victim.id)
    assert [p.name for p in (scene.node.state_dir / "intents").iterdir()] == [victim.id]
    await asyncio.to_thread(scene.checker.learn)
    await scene.kill_while_blocked(blocked)
    with pytest.raises(Unavailable, match="connection lost"):  # not a deadline: the kill cut it
        await creation
    await asyncio.to_thread(delete_netns, ns_victim)


async def _created_anyway(scene: NativeScene, victim) -> None:
    """What a PR #295 runtime does when the plugin dies in RunPodSandbox: it goes on without it
    and lists the pod running with no IP. After the restart nri-cni must not attach it behind the
    runtime's back (the runtime would never learn the IPs): it names it broken, "missed"."""
    scene.block.arm()
    creation = asyncio.create_task(scene.runtime.run_pod_sandbox(victim))
    await scene.kill_while_blocked(await scene.wait_blocked("ADD", victim.id))
    with pytest.raises(Unavailable, match="connection lost"):
        await creation
    scene.runtime.pods.append(victim)  # running, no IP
    await scene.start_daemon()  # until the verify round its Synchronize started has ended
    broken = await asyncio.to_thread(broken_by_name, scene.daemon)
    assert broken == {victim.id: "missed"}, scene.daemon.log_tail()
    node = scene.node
    assert [r for r in node.reservations() if r.container_id == victim.id] == []
    assert not [f for f in node.cache_dir.glob("results/*") if victim.id in f.name]
    assert [li.name for li in await asyncio.to_thread(victim_links, victim)] == ["lo"]
    # the admin deletes the pod (docs/reliability.md); then nothing of it is left
    await scene.runtime.stop_pod_sandbox(victim)
    await scene.runtime.remove_pod_sandbox(victim)
    scene.runtime.pods.remove(victim)
    await scene.assert_truth(victim.id)


async def _repair_cut(scene: NativeScene, victim) -> None:
    """Verify finds the victim's eth0 deleted; its repair's ADD is held when nri-cni dies. After
    the restart's Synchronize the verify repairs it again, with the IPs the runtime reports."""
    await scene.create(victim)
    await asyncio.to_thread(scene.checker.learn)
    pod = RuntimePod(victim.id, victim.linux.namespaces[0].path, tuple(victim.ips))
    before = await asyncio.to_thread(pod_interfaces, pod.netns)
    scene.block.arm()
    assert await asyncio.to_thread(delete_link, "eth0", pod.netns)  # the damage
    await scene.kill_while_blocked(await scene.wait_blocked("ADD", victim.id))
    await scene.start_daemon()  # until the verify round its Synchronize started has ended

    def repair_recorded() -> bool:  # the record comes when the repair ends, after the link is back
        return "repair" in [op["op"] for op in scene.daemon.op_lines() if op["podId"] == victim.id]

    while not await asyncio.to_thread(repair_recorded):  # that round's, or a timer round's (1 s)
        await asyncio.sleep(0.05)  # (a hang: pytest's timeout)
    left = await asyncio.to_thread(damage_left, pod, before, ["eth0"], scene.bridge)
    assert left == [], scene.daemon.log_tail()
    assert await asyncio.to_thread(whole_problems, pod, ["eth0", "net1"]) == []
    await scene.runtime.stop_pod_sandbox(victim)
    await scene.runtime.remove_pod_sandbox(victim)
    scene.runtime.pods.remove(victim)
    await scene.assert_truth(victim.id)


def victim_links(victim):
    return list_links(victim.linux.namespaces[0].path)


@pytest.mark.parametrize("kind", KINDS)
def test_kill9_of_nri_cni_while_a_plugin_runs_native(node, kind):
    scene = NativeScene(node, kind)
    ns_victim = node.jan.netns()
    victim = pod_message(new_pod_id(), ns_victim.path, name="victim")

    async def scenario():
        try:
            await scene.begin()
            scene.checker.add_markers(victim.id)
            if kind in ("add", "finalize"):
                await _creation_cut(scene, kind.upper(), victim, ns_victim)
            elif kind == "add-kept":
                await _created_anyway(scene, victim)
                return
            elif kind == "repair":
                await _repair_cut(scene, victim)
                return
            elif kind == "rollback":
                (node.tmp / "ctl" / "add-code").write_text("11")
                await _creation_cut(scene, "DEL", victim, ns_victim)
                (node.tmp / "ctl" / "add-code").unlink()
            elif kind == "del":
                await scene.create(victim)
                await asyncio.to_thread(scene.checker.learn)
                scene.block.arm()
                stopping = asyncio.create_task(scene.runtime.stop_pod_sandbox(victim))
                await scene.kill_while_blocked(await scene.wait_blocked("DEL", victim.id))
                with pytest.raises(Unavailable, match="connection lost"):
                    await stopping
                # the runtime stops the pod without us: its netns goes, then the pod
                await asyncio.to_thread(delete_netns, ns_victim)
                scene.runtime.pods.remove(victim)
            elif kind == "gc":
                scene.block.arm()
                collecting = asyncio.create_task(asyncio.to_thread(scene.daemon.ask, "gc"))
                await scene.kill_while_blocked(await scene.wait_blocked("GC"))
                with pytest.raises(LocalProtocolError, match="closed the connection"):
                    await collecting
            elif kind == "recovery":
                scene.block.arm()
                creation = asyncio.create_task(scene.runtime.run_pod_sandbox(victim))
                blocked = await scene.wait_blocked("ADD", victim.id)
                await asyncio.to_thread(scene.checker.learn)
                await asyncio.to_thread(scene.daemon.kill9)
                scene.block.release(blocked)  # still armed: the recovery's DEL blocks
                with pytest.raises(Unavailable, match="connection lost"):
                    await creation
                await asyncio.to_thread(delete_netns, ns_victim)
                scene.connections += 1  # (the start below registers only after recovery)
                starting = asyncio.create_task(asyncio.to_thread(scene.daemon.start))
                recovering = await scene.wait_blocked("DEL", victim.id)
                await scene.kill_while_blocked(recovering)
                with pytest.raises(RuntimeError):
                    await starting  # it died in recovery, before it answered
                scene.connections -= 1
            await scene.start_daemon()
            await scene.assert_truth(victim.id)
        finally:
            await scene.end()

    run(scenario())
