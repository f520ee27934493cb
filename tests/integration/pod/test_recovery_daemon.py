"""The daemon's side of recovery, in-process against the NRI test double with real plugins:

- a native RunPodSandbox answered past the runtime's timeout: the runtime drops the connection
  and creates the pod without its IPs; the attach finishes (nothing cut halfway), is released
  at once, and the pod is reported "missed" by name; an answer in time is kept; nri-cni asks
  for a longer timeout when configured (NRI PR #304);
- a pod attached just before a Synchronize that does not list it yet (the runtime stores a pod
  only after its RunPodSandbox returned) is not garbage; one more Synchronize without it and
  it is;
- GC runs alone: it waits for the pod operation in flight, and one asked for meanwhile waits
  for it; the GC timer retries a DEL that failed until it succeeds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from nri_cni.errors import GrpcCode, RPCError
from tests.plugins.block_plugin import BlockControl
from tests.support.bin_dir import install_test_plugin
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.netns import get_link
from tests.support.recovery_node import install_ctl, read_calls

pytestmark = pytest.mark.netns


def _podnet(node, subnet, **finalize):
    net = node.bridge_net("podnet", subnet)
    if finalize:
        net["finalize_plugins"] = [node.fake("fake-finalize", **finalize)]
    return [{"name": "podnet", "default": True, "conflist": net}]


def test_a_native_answer_past_the_runtime_deadline_is_a_missed_pod(node):
    """The runtime gives up on RunPodSandbox (and creates the pod without its IPs): the attach
    finishes (nothing is cut halfway), then is released at once, and the pod is reported by
    name as missed, with what an admin does."""
    ns = node.jan.netns()
    cfg = node.config("native", _podnet(node, "10.244.72.0/24", FINALIZE={"sleep": 1.0}))
    cfg["nri"]["request_timeout"] = "5s"
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            # asked for in ConfigureResponse.request_timeout (NRI PR #304)
            assert h.runtime.plugin.configure_response.request_timeout == 5000
            h.runtime.request_timeout_ms = 300  # what this runtime grants regardless
            h.runtime.pods = [pod]  # past the deadline it creates the pod without us
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            assert err.value.code == GrpcCode.DEADLINE_EXCEEDED
            h.runtime.request_timeout_ms = 20000
            await h.runtime.wait_plugin(2)  # the stub reconnected at once
            await h.settle()
            health = h.daemon.pods.health
            # the cut-off attach is still in its FINALIZE: wait for its end and its verdict
            await until(lambda: health.get(pod.id) is not None and not h.daemon.pods.view.busy(pod.id))
            verdict = health.get(pod.id)
            assert verdict is not None, h.daemon.reports.status()
            assert (verdict.state.value, verdict.code.value) == ("broken", "missed")
            assert "past the runtime's 0.3 s NRI request timeout" in verdict.reason
            assert "kubectl delete pod" in verdict.reason
            (named,) = h.daemon.reports.status()["broken"]
            assert (named["pod"], named["name"], named["code"]) == (pod.id, pod.name, "missed")
            # released at once, nothing left behind the runtime's back
            assert h.daemon.pods.view.attachments(pod.id) == []
            assert await asyncio.to_thread(get_link, "eth0", ns) is None
            assert node.reservations() == []
            assert list((node.state_dir / "intents").iterdir()) == []
            commands = [c["command"] for c in node.calls()]
            assert commands[0] == "FINALIZE" and commands.count("FINALIZE") == 1, commands
            # a verify round later: still missed, nothing attached again
            await h.daemon.pods.timers.verify()
            assert health.get(pod.id).code.value == "missed"
            assert node.reservations() == []
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
            assert health.get(pod.id) is None
        assert node.reservations() == []

    run(scenario())


def test_a_native_answer_in_time_is_kept(node):
    """The same slow FINALIZE within the runtime's deadline: answered, attached, no verdict
    but ok."""
    ns = node.jan.netns()
    cfg = node.config("native", _podnet(node, "10.244.75.0/24", FINALIZE={"sleep": 0.3}))
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            resp = await h.runtime.run_pod_sandbox(pod)
            assert len(resp.adjust.network.ips) == 1
            assert [r.container_id for r in node.reservations()] == [pod.id]
            assert h.daemon.pods.health.get(pod.id) is None
            assert not [r.pod_id for r in h.daemon.pods.roster.view().values() if r.late]
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
        assert node.reservations() == []

    run(scenario())


@pytest.mark.parametrize("listed_before", [False, True])
def test_pod_missing_from_one_synchronize_is_kept_once(node, listed_before):
    """listed_before=False: attached just before a Synchronize that does not list it yet.
    True: listed, then left out of one Synchronize (containerd lists no pod whose state it
    cannot tell yet, e.g. right after its restart)."""
    ns = node.jan.netns()
    cfg = node.config("native", _podnet(node, "10.244.73.0/24"))
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:  # the runtime's list: empty
            await h.runtime.run_pod_sandbox(pod)
            if listed_before:
                h.runtime.pods = [pod]
                await h.runtime.close()
                await h.runtime.wait_plugin(2)
                await h.settle()
                assert h.daemon.reports.status()["unconfirmed"] == 0
                h.runtime.pods = []
            await h.runtime.close()  # reconnect; Synchronize without the pod
            n = 3 if listed_before else 2
            await h.runtime.wait_plugin(n)
            await h.settle()
            assert [r.container_id for r in node.reservations()] == [pod.id]
            assert h.daemon.reports.status()["unconfirmed"] == 1

            await h.runtime.close()  # and once more: now it is garbage
            await h.runtime.wait_plugin(n + 1)
            await h.settle()
            assert node.reservations() == []
            assert h.daemon.pods.view.attachments() == []
            assert h.daemon.reports.status()["unconfirmed"] == 0

    run(scenario())


def test_pod_listed_by_the_next_synchronize_is_confirmed(node):
    ns = node.jan.netns()
    cfg = node.config("native", _podnet(node, "10.244.74.0/24"))
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(pod)
            h.runtime.pods = [pod]
            await h.runtime.close()
            await h.runtime.wait_plugin(2)
            await h.settle()
            assert h.daemon.reports.status()["unconfirmed"] == 0
            assert [r.container_id for r in node.reservations()] == [pod.id]
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
        assert node.reservations() == []

    run(scenario())


def _ctl_net(node, subnet, control, **finalize):
    net = _podnet(node, subnet, **finalize)
    net[0]["conflist"]["plugins"].append({"type": "ctl", "control": str(control)})
    return net


def test_gc_runs_alone_between_pod_operations(node):
    """GC waits for the pod operation in flight, and an operation that comes meanwhile waits for
    GC. Each step is an event the test sees (a plugin blocked, a lock's waiters), not a time."""
    install_ctl(node.bin_dir)
    install_test_plugin(node.bin_dir, "block_plugin", "block")
    control = node.tmp / "ctl"
    control.mkdir()
    block = BlockControl(node.tmp / "block")
    net = _ctl_net(node, "10.244.75.0/24", control)
    # armed after the start's own GC: A's FINALIZE and the GC verb block until released
    net[0]["conflist"]["plugins"].append(
        {"type": "block", "block": block.config(armed=True, commands=["GC"])}
    )
    net[0]["conflist"]["finalize_plugins"] = [
        {"type": "block", "block": block.config(armed=True, commands=["FINALIZE"])}
    ]
    cfg = node.config("native", net)
    ns_a, ns_b = node.jan.netns(), node.jan.netns()
    a, b = pod_message(new_pod_id(), ns_a.path), pod_message(new_pod_id(), ns_b.path)

    def adds_of(pod) -> list[list]:
        return [c for c in read_calls(control) if c[0] == "ADD" and c[1] == pod.id]

    async def scenario():
        # A's RunPodSandbox lasts as long as the test holds its FINALIZE: no deadline of its own
        async with DaemonHarness(node, cfg, request_timeout_ms=300_000) as h:
            locks = h.daemon.pods.locks
            h.runtime.pods = [a, b]
            block.arm()
            first = asyncio.create_task(h.runtime.run_pod_sandbox(a))
            finalize_a = await asyncio.to_thread(block.wait_blocked, "FINALIZE", a.id, timeout=60)
            gc = asyncio.create_task(h.daemon.pods.timers.gc(reason="test"))
            await until(lambda: locks._gc_waiting == 1)  # GC waits for A's operation
            second = asyncio.create_task(h.runtime.run_pod_sandbox(b))
            await until(lambda: locks._operations == 2)  # B's ADD waits too: behind GC
            block.release(finalize_a)
            gc_verb = await asyncio.to_thread(block.wait_blocked, "GC", None, timeout=60)
            # GC runs alone: A's whole operation is over, B's ADD has not begun
            assert block.done(finalize_a) and locks._active == 0
            assert adds_of(b) == []
            block.disarm()  # B's FINALIZE, to come, passes
            block.release(gc_verb)
            await asyncio.gather(first, gc, second)
            calls = read_calls(control)
            gc_calls = [c for c in calls if c[0] == "GC"]
            # (the first one is the start's, after Synchronize) A attached, B not yet
            assert len(gc_calls) == 2 and gc_calls[1][4] == [a.id]
            assert calls.index(adds_of(b)[0]) > calls.index(gc_calls[1])
            for pod in (a, b):
                await h.runtime.stop_pod_sandbox(pod)
                await h.runtime.remove_pod_sandbox(pod)
        assert node.reservations() == []

    run(scenario())


async def until(predicate, timeout: float = 60.0) -> None:
    """Waits for an event the test caused; the deadline only fails a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the event did not come"
        await asyncio.sleep(0.01)


def test_gc_timer_retries_a_failed_del_until_it_succeeds(node):
    install_ctl(node.bin_dir)
    control = node.tmp / "ctl"
    control.mkdir()
    ns = node.jan.netns()
    cfg = node.config("native", _ctl_net(node, "10.244.76.0/24", control), gc={"interval": "300ms"})
    pod = pod_message(new_pod_id(), ns.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(pod)
            (control / "del-fail").write_text("1")
            with pytest.raises(RPCError) as err:
                await h.runtime.stop_pod_sandbox(pod)  # reported to the runtime
            assert "ctl: DEL fails as told" in str(err.value)
            with pytest.raises(RPCError):
                await h.runtime.remove_pod_sandbox(pod)
            # timer GCs retry (stop, remove, then at least two of them)
            await until(lambda: len([c for c in read_calls(control) if c[0] == "DEL"]) >= 4)
            assert [r.container_id for r in node.reservations()] == [pod.id]  # still failing
            (control / "del-fail").unlink()
            # the reservation goes while the DEL chain runs, the cache entry once it finished
            await until(lambda: not node.reservations() and not h.daemon.pods.view.attachments())
            assert node.reservations() == []
            assert h.daemon.pods.view.attachments() == []

    run(scenario())
