"""The daemon's branches no test went through, with real plugins behind the
NRI test double (and, for SIGHUP, `nri-cni run` as a process):

- GC before the runtime's first pod list is refused and deletes nothing;
- a failed RunPodSandbox under failure_policy keep, and auto's runtime version check (keep where
  failing the pod leaks the sandbox: containerd before 2.2.6); the kept pod is retried;
- host-network pods (no netns): nothing attached, no plugin run, reported as such, not broken;
- a plugin past `cni.plugin_timeout` inside a pod's ADD: killed, the ADD rolled back, an error
  that says so;
- SIGHUP reloads the configuration (the file watch off)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time

import pytest
import yaml

from nri_cni.config import parse_config
from nri_cni.daemon.app import build_daemon
from nri_cni.errors import RPCError
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.names import unique_name
from tests.support.nri_runtime import NriRuntime
from tests.support.nricni import NriCni

pytestmark = pytest.mark.netns


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nri_cni.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def until(what, timeout: float = 120.0, step: float = 0.05):
    """Waits for an event the test caused (not a retry: a deadline is a failure)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what.__doc__ or what}")
        await asyncio.sleep(step)


def _cached(node) -> list[str]:
    results = node.cache_dir / "results"
    return sorted(p.name for p in results.iterdir()) if results.exists() else []


def _podnet(node, subnet: str) -> list[dict]:
    return [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", subnet)}]


def test_gc_before_the_first_synchronize_is_refused_and_deletes_nothing(node):
    ns = node.jan.netns()
    cfg = node.config("native", _podnet(node, "10.244.45.0/24"))
    pod = pod_message(new_pod_id(), ns.path)
    sock = cfg["daemon"]["socket"]
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(pod)
        attached = _cached(node)
        assert len(attached) == 1 and len(node.reservations()) == 1

        # nri-cni restarts while the runtime is away: no pod list, so every attachment would
        # look like garbage; the CLI's GC is refused, and nothing is deleted
        assert not os.path.exists(cfg["nri"]["socket"])
        daemon = build_daemon(parse_config(cfg, str(node.tmp / "config.yaml")))
        task = asyncio.create_task(daemon.run(handle_signals=False))
        try:

            async def serving():
                return os.path.exists(sock)

            await until(serving)
            code, out, err = await cli("gc", "--socket", sock)
            assert code == 1 and "not synchronized" in err, (out, err)
            code, _, _ = await cli("status", "--socket", sock)
            assert code == 2  # not ready: not synchronized
            assert _cached(node) == attached and len(node.reservations()) == 1
            assert await asyncio.to_thread(ns.link, "eth0") is not None
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 60)

        # the runtime back, listing the pod: it keeps its network until it is removed
        async with DaemonHarness(node, cfg, pods=[pod]) as h:
            assert _cached(node) == attached
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)

    run(scenario())
    assert node.reservations() == [] and _cached(node) == []
    assert checker.leaks() == []


@pytest.mark.parametrize(
    "policy, runtime, version, kept",
    [
        ("keep", "containerd", "v2.2.6", True),  # keep: whatever the runtime
        ("fail", "containerd", "v2.1.9", False),  # fail: whatever the runtime
        ("auto", "containerd", "v2.1.9", True),  # before 2.2.6 failing it leaks the sandbox
        ("auto", "containerd", "2.2.6", False),
        ("auto", "containerd", "v2.3.0-rc.1", False),
        ("auto", "containerd", "devel", True),  # a version it cannot read: the safe side
        ("auto", "cri-o", "1.30.0", False),  # no known leak
        ("auto", "cri-o", "1.36.3", False),  # measured: no sandbox left (tests/e2e/test_crio_secondary.py)
    ],
)
def test_failure_policy_and_the_runtime_version_check(node, caplog, policy, runtime, version, kept):
    ns = node.jan.netns()
    master = unique_name("mv")  # missing for now: macvlan's ADD fails
    node.jan.track_link(master)
    net = node.macvlan_net("lan", "10.244.46.0/24", master)
    cfg = node.config(
        "secondary",
        [{"name": "lan", "default": True, "conflist": net}],
        failure_policy=policy,
        primary_network="runtimes-own",  # eth0 is the runtime's (its libcni cache: empty here)
    )
    cfg["cni"]["runtime_cache_dir"] = str(node.tmp / "runtime-cache")
    cfg["gc"] = {"interval": "200ms"}  # the timer that retries kept pods
    pod = pod_message(new_pod_id(), ns.path, name="web")
    sock = cfg["daemon"]["socket"]
    checker = node.leak_checker(ns).start()
    caplog.set_level(logging.WARNING, logger="nri_cni.daemon")

    async def scenario():
        async with DaemonHarness(node, cfg, runtime_name=runtime, runtime_version=version) as h:
            if not kept:
                with pytest.raises(RPCError) as err:
                    await h.runtime.run_pod_sandbox(pod)
                assert "macvlan" in str(err.value) and "Link not found" in str(err.value)
                assert _cached(node) == [] and node.reservations() == []
                return
            await h.runtime.run_pod_sandbox(pod)  # the pod goes on, without its network yet
            assert _cached(node) == [] and node.reservations() == []  # the failed ADD rolled back
            code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
            assert [p["state"] for p in json.loads(raw) if p["id"] == pod.id] == ["repair"]
            code, out, _ = await cli("status", "--socket", sock)
            assert code == 1 and "1 pod(s) waiting for repair" in out, out

            async def retried():
                """The timer retried the kept pod, and failed: the cause is still there."""
                return [
                    r
                    for r in caplog.records
                    if pod.id in r.getMessage() and "repair failed" in r.getMessage()
                ]

            await until(retried)
            # the cause goes: the timer's next retry (after a backoff of seconds) attaches the kept pod
            await asyncio.to_thread(node.jan.bridge, master)

            async def attached():
                code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
                return [p for p in json.loads(raw) if p["id"] == pod.id and p["state"] == "ready"]

            (report,) = await until(attached)
            assert [n["interface"] for n in report["network-status"]] == ["net1"]
            assert await asyncio.to_thread(ns.link, "net1") is not None
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)

    run(scenario())
    assert node.reservations() == [] and _cached(node) == []
    assert checker.leaks() == []


def test_host_network_pods_get_nothing_and_are_not_broken(node):
    cfg = node.config("native", _podnet(node, "10.244.47.0/24") + [], failure_policy="fail")
    cfg["networks"][0]["conflist"]["plugins"].append(node.fake("fake-ok"))
    host = pod_message(new_pod_id(), "", name="hostpod")  # no network namespace
    sock = cfg["daemon"]["socket"]

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            resp = await h.runtime.run_pod_sandbox(host)
            assert list(resp.adjust.network.ips) == []
            code, raw, _ = await cli("pods", "--socket", sock, "-o", "json")
            (report,) = json.loads(raw)
            assert (report["state"], report["network-status"]) == ("host-network", [])
            assert report["verify"] is None or report["verify"]["state"] != "broken"
            code, raw, _ = await cli("status", "--socket", sock, "-o", "json")
            status = json.loads(raw)
            assert code == 0 and status["broken"] == [] and status["pendingRepair"] == []
            await h.runtime.stop_pod_sandbox(host)
            await h.runtime.remove_pod_sandbox(host)

    run(scenario())
    assert [c["command"] for c in node.calls() if c["command"] not in ("STATUS", "VERSION", "GC")] == []
    assert _cached(node) == [] and node.reservations() == []


def test_a_plugin_past_its_timeout_inside_a_pod_add_is_killed_and_the_add_rolled_back(node):
    ns = node.jan.netns()
    nets = _podnet(node, "10.244.48.0/24")
    nets[0]["conflist"]["plugins"].append(node.fake("fake-finalize", ADD={"sleep": 30}))
    cfg = node.config("native", nets)
    cfg["cni"]["plugin_timeout"] = "1s"
    pod = pod_message(new_pod_id(), ns.path)
    checker = node.leak_checker(ns).start()

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            text = str(err.value)
            assert "fake-finalize" in text and "ADD" in text and "timeout" in text.lower(), text
            # rolled back: the chain's DEL ran, the timed-out plugin's included (it may have done
            # anything), last first
            dels = [c["type"] for c in node.calls() if c["command"] == "DEL"]
            assert dels == ["fake-finalize"], dels
            assert _cached(node) == [] and node.reservations() == []
            assert list((node.state_dir / "intents").glob("*")) == []
            assert await asyncio.to_thread(ns.link, "eth0") is None

    run(scenario())
    assert checker.leaks() == []


def test_sighup_reloads_the_configuration(node):
    cfg = node.config("native", _podnet(node, "10.244.49.0/24"))
    cfg["reload"] = {"watch": False, "rescan_interval": 0}  # SIGHUP is the only trigger
    cfg["daemon"]["socket"] = str(node.tmp / "d.sock")

    async def scenario():
        runtime = NriRuntime(cfg["nri"]["socket"])
        await runtime.start()
        daemon = NriCni(node.tmp, cfg)
        try:
            await asyncio.to_thread(daemon.start)
            assert list(daemon.status()["networks"]) == ["podnet"]
            extra = {
                "name": "lan",
                "namespaces": ["default"],
                "conflist": node.bridge_net("lan", "10.244.50.0/24"),
            }
            changed = {**cfg, "networks": cfg["networks"] + [extra]}
            daemon.config_path.write_text(yaml.safe_dump(changed))
            status = daemon.status()
            assert list(status["networks"]) == ["podnet"] and status["reload"]["applied"] == 0
            # written, and nothing to read it but a signal: no inotify watch, no rescan (0)
            assert status["reload"]["inotify"] is False
            daemon.proc.send_signal(signal.SIGHUP)

            async def reloaded():
                return daemon.status()["reload"]["applied"] == 1

            await until(reloaded)
            status = daemon.status()
            assert sorted(status["networks"]) == ["lan", "podnet"] and not status["reload"]["inotify"]
            assert daemon.proc.poll() is None  # SIGHUP does not stop it
        finally:
            await asyncio.to_thread(daemon.stop)
            await runtime.stop()

    run(scenario())
