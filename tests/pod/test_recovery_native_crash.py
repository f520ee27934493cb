"""Acceptance 1, NRI-native mode: nri-cni runs as a real process against the runtime-side NRI
test double and kills itself (NRI_CNI_CRASH_AT, SIGKILL) at every step of a two-network ADD with
FINALIZE and at two steps of a DEL. The double then does what containerd does when a plugin's
connection dies: it goes on without it (the pod is created anyway; a stopped pod's netns is
removed and the pod forgotten). nri-cni is started again; after its Synchronize every pod the
runtime has is fully attached, or, for the pod the runtime created without nri-cni's answer,
reported broken "missed" with nothing of it left (issue 17: the runtime learns IPs only from the
answer), and nothing else is left: reservations, host veths, bridge ports, cache files, intent
records."""

from __future__ import annotations

import asyncio
import signal

import pytest

from nri_cni.pod.hooks import CRASH_ENV
from tests.e2e.nricni import NriCni
from tests.pod.conftest import new_pod_id, pod_message, run
from tests.support.netns import delete_netns, get_link
from tests.support.nri_runtime import NriRuntime

pytestmark = pytest.mark.netns

ADD_POINTS = [
    "ADD:podnet:0:before",
    "ADD:podnet:0:after",
    "ADD:podnet:1:before",
    "ADD:podnet:1:after",
    "cache:podnet",
    "ADD:fastnet:0:before",
    "ADD:fastnet:0:after",
    "cache:fastnet",
    "FINALIZE:podnet:0:before",
    "FINALIZE:podnet:0:after",
]
DEL_POINTS = ["DEL:fastnet:0:before", "DEL:podnet:1:after"]


def _networks(node):
    master, _ = node.jan.veth()
    eth0 = node.bridge_net("podnet", "10.244.70.0/24")
    eth0["finalize_plugins"] = [node.fake("fake-finalize")]
    return [
        {"name": "podnet", "default": True, "conflist": eth0},
        {
            "name": "fastnet",
            "default": True,
            "conflist": node.macvlan_net("fastnet", "10.244.71.0/24", master),
        },
    ]


async def _start(daemon: NriCni, runtime: NriRuntime, count: int, crash_at: str = "") -> None:
    daemon.env.pop(CRASH_ENV, None)
    await asyncio.to_thread(daemon.start, env={CRASH_ENV: crash_at} if crash_at else {})
    await runtime.wait_plugin(count)


async def _wait_whole(node, daemon: NriCni, pod_ids, attached, timeout: float = 20) -> None:
    """Until `nri-cni pods` shows exactly these pods, `attached` ones with eth0 and net1."""
    want = {p: ["eth0", "net1"] if p in attached else [] for p in pod_ids}
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = {
            p["id"]: [n["interface"] for n in p["network-status"]]
            for p in await asyncio.to_thread(daemon.pods)
        }
        st = await asyncio.to_thread(daemon.status)
        if got == want and not st["pendingRollback"] and not st["pendingRepair"]:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"pods {got}, wanted {want}; status {st}\n{daemon.log_tail()}")
        await asyncio.sleep(0.05)


async def _assert_attached(node, pod, ns) -> None:
    for ifname in ("eth0", "net1"):
        link = await asyncio.to_thread(get_link, ifname, ns)
        assert link is not None and link.addrs, (pod.id, ifname)
    assert sorted(r.ifname for r in node.reservations() if r.container_id == pod.id) == ["eth0", "net1"]


@pytest.mark.parametrize("point", ADD_POINTS + DEL_POINTS)
def test_kill9_at_every_step_in_native_mode(node, point):
    ns_survivor, ns_victim = node.jan.netns(), node.jan.netns()
    cfg = node.config("native", _networks(node))
    survivor = pod_message(new_pod_id(), ns_survivor.path, name="survivor")
    victim = pod_message(new_pod_id(), ns_victim.path, name="victim")

    async def scenario():
        runtime = NriRuntime(
            cfg["nri"]["socket"],
            runtime_name="nri-test-double",
            runtime_version="1.0.0",
            request_timeout_ms=20000,
        )
        await runtime.start()
        daemon = NriCni(node.tmp, cfg)
        try:
            await _start(daemon, runtime, 1)
            await runtime.run_pod_sandbox(survivor)
            runtime.pods = [survivor]
            await asyncio.to_thread(daemon.stop)
            # the survivor's state is the baseline (pyroute2: never on the running loop)
            checker = await asyncio.to_thread(lambda: node.leak_checker().start())
            checker.add_markers(victim.id)

            await _start(daemon, runtime, 2, crash_at=point)
            if point.startswith("DEL"):
                await runtime.run_pod_sandbox(victim)
                await asyncio.to_thread(checker.learn)
                with pytest.raises(Exception):
                    await runtime.stop_pod_sandbox(victim)
                # the runtime stops the pod without us: its netns goes, then the pod
                await asyncio.to_thread(delete_netns, ns_victim)
                live = [survivor]
            else:
                with pytest.raises(Exception):
                    await runtime.run_pod_sandbox(victim)
                await asyncio.to_thread(checker.learn)
                [intent] = [p.name for p in (node.state_dir / "intents").iterdir()]
                assert intent == victim.id
                live = [survivor, victim]  # created anyway, without the plugin's work
            assert await asyncio.to_thread(daemon.proc.wait, 10) == -signal.SIGKILL

            runtime.pods = live
            await _start(daemon, runtime, 3)
            await _wait_whole(node, daemon, [p.id for p in live], [survivor.id])
            await _assert_attached(node, survivor, ns_survivor)
            # attached once: the repair after each Synchronize found it whole
            assert [op["op"] for op in daemon.op_lines() if op["podId"] == survivor.id] == ["add"]
            if victim in live:  # listed without nri-cni's answer: missed, never attached behind it
                for _ in range(200):
                    if f"id={victim.id} is broken (missed)" in daemon.log_tail(400):
                        break
                    await asyncio.sleep(0.05)
                assert f"id={victim.id} is broken (missed)" in daemon.log_tail(400)
            assert [r for r in node.reservations() if r.container_id == victim.id] == []
            assert await asyncio.to_thread(checker.leaks) == []

            for pod in live:
                await runtime.stop_pod_sandbox(pod)
                await runtime.remove_pod_sandbox(pod)
            assert node.reservations() == []
            assert list(node.cache_dir.glob("results/*")) == []
            assert list((node.state_dir / "intents").iterdir()) == []
        finally:
            await asyncio.to_thread(daemon.stop)
            await runtime.stop()
        return checker

    checker = run(scenario())
    assert checker.leaks() == []
