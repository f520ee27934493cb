"""The lifecycle and hot reload in a running daemon (NRI-native mode, the NRI test double), with
the real bridge and host-local plugins and the lifecycle test plugin, which creates the host
bridge at INIT and removes it at DEINIT."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from nri_cni.errors import CniCode, CNIError, RPCError
from nri_cni.lifecycle import generation_id
from nri_cni.local import proto as localproto
from tests.support.conflists import bridge_conflist, host_local
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.names import unique_name
from tests.support.netns import get_link

pytestmark = pytest.mark.netns


def lifecycle_net(node, name: str, subnet: str, bridge: str, **plugin_keys) -> dict:
    """bridge + host-local, then the lifecycle plugin owning the bridge's existence."""
    node.jan.track_link(bridge)
    lifecycle = {
        "type": "lifecycle-test",
        "bridge": bridge,
        "log": str(node.lc.path),
        "counter": str(node.tmp / "counter"),
        "cni.dev/lifecycle": ["init", "deinit"],
        **plugin_keys,
    }
    return bridge_conflist(name, bridge, host_local(node.ipam_dir, subnet), then=[lifecycle])


def node_config(node, networks: list[dict], **extra) -> dict:
    cfg = node.config("native", networks, **extra)
    cfg.setdefault("reload", {"watch": True, "rescan_interval": 0, "debounce": "50ms"})
    cfg.setdefault("lifecycle", {"retry_initial": "300ms", "retry_max": "1s"})
    return cfg


def write_config(node, cfg: dict) -> None:
    path = node.tmp / "config.yaml"
    tmp = node.tmp / ".config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))  # key order is in the bytes
    tmp.rename(path)


async def until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        await asyncio.sleep(0.02)


async def reconfigure(h: DaemonHarness, node, cfg: dict) -> None:
    """Writes the config file and waits until the daemon runs it and its INITs/DEINITs are done."""
    applied = h.daemon.reloader.state.applied
    write_config(node, cfg)
    await until(lambda: h.daemon.reloader.state.applied > applied, what="reload")
    await h.daemon.lifecycle.idle()


def gen_of(conflist: dict) -> str:
    from nri_cni.cni.config import parse_conflist

    return generation_id(parse_conflist(conflist).bytes)


def index_of(calls, command: str, name: str) -> int:
    return next(i for i, c in enumerate(calls) if c["command"] == command and c["name"] == name)


def real_plugin_verbs(node) -> set[str]:
    return {line.split()[1] for line in node.spy_log.read_text().splitlines() if len(line.split()) > 1}


async def bridge_exists(name: str) -> bool:
    return await asyncio.to_thread(get_link, name) is not None


def test_init_and_deinit_across_start_reload_pods_removal_and_restart(lnode):
    node = lnode
    ns1, ns2 = node.jan.netns(), node.jan.netns()
    br_blue, br_green = unique_name("lb"), unique_name("lg")
    blue = lifecycle_net(node, "blue", "10.245.1.0/24", br_blue, tag="blue-1")
    green = lifecycle_net(node, "green", "10.245.2.0/24", br_green, tag="green-1")
    with_blue = node_config(node, [{"name": "blue", "default": True, "conflist": blue}])
    with_green = node_config(
        node,
        [
            {"name": "blue", "default": True, "conflist": blue},
            {"name": "green", "namespaces": ["default"], "conflist": green},
        ],
    )
    write_config(node, with_blue)
    p1 = pod_message(new_pod_id(), ns1.path)
    p2 = pod_message(new_pod_id(), ns2.path, annotations={"k8s.v1.cni.cncf.io/networks": "green"})

    async def scenario():
        async with DaemonHarness(node, with_blue) as h:
            await h.daemon.lifecycle.idle()
            assert node.lc.seq() == [("INIT", gen_of(blue))]
            assert await bridge_exists(br_blue)
            await h.runtime.run_pod_sandbox(p1)

            await reconfigure(h, node, with_green)  # a new network: INIT, before its first ADD
            assert node.lc.seq("green") == [("INIT", gen_of(green))]
            assert await bridge_exists(br_green)
            resp = await h.runtime.run_pod_sandbox(p2)
            assert {i.name for i in resp.adjust.network.interfaces} == {"eth0", "net1"}

            await reconfigure(h, node, with_blue)  # green removed: p2 still uses it
            report = h.daemon.reports.status()["lifecycle"]["green"]["retired"]
            assert [(r["generation"], r["attachments"]) for r in report] == [(gen_of(green), 1)]
            assert node.lc.seq("green") == [("INIT", gen_of(green))]
            assert await bridge_exists(br_green)

        # nri-cni restarts; the runtime still has both pods
        async with DaemonHarness(node, with_blue, pods=[p1, p2]) as h:
            await h.daemon.lifecycle.idle()
            assert node.lc.seq() == [("INIT", gen_of(blue)), ("INIT", gen_of(green))]  # no repeat
            await h.runtime.stop_pod_sandbox(p2)  # DEL of green from the cache, then DEINIT
            await h.runtime.remove_pod_sandbox(p2)
            await until(lambda: "green" not in h.daemon.reports.status()["lifecycle"], what="DEINIT of green")
            assert not await bridge_exists(br_green)
            await h.runtime.stop_pod_sandbox(p1)
            await h.runtime.remove_pod_sandbox(p1)
            await h.daemon.lifecycle.idle()

    run(scenario())
    calls = node.lc.all()
    assert node.lc.seq("blue") == [("INIT", gen_of(blue))]
    assert node.lc.seq("green") == [("INIT", gen_of(green)), ("DEINIT", gen_of(green))]
    assert index_of(calls, "INIT", "blue") < index_of(calls, "ADD", "blue")
    assert index_of(calls, "INIT", "green") < index_of(calls, "ADD", "green")
    green_dels = [i for i, c in enumerate(calls) if c["command"] == "DEL" and c["name"] == "green"]
    assert green_dels and max(green_dels) < index_of(calls, "DEINIT", "green")
    deinit = calls[index_of(calls, "DEINIT", "green")]
    assert deinit["tag"] == "green-1" and deinit["bridge"] == br_green  # the last config of green
    assert all(c["tag"] == "green-1" for c in calls if c["name"] == "green")
    assert not [c for c in calls if c.get("overlap")]
    assert node.reservations() == []
    assert list(node.cache_dir.glob("results/*")) == []
    # the real plugins (no lifecycle key) were never asked for the new verbs
    verbs = real_plugin_verbs(node)
    assert {"ADD", "DEL"} <= verbs and not verbs & {"INIT", "DEINIT"}


def test_a_changed_network_keeps_old_attachments_on_their_config_until_their_del(lnode):
    node = lnode
    ns1, ns2 = node.jan.netns(), node.jan.netns()
    bridge = unique_name("lb")
    v1 = lifecycle_net(node, "blue", "10.245.3.0/24", bridge, tag="v1")
    v2 = lifecycle_net(node, "blue", "10.245.3.0/24", bridge, tag="v2")
    cfg1 = node_config(node, [{"name": "blue", "default": True, "conflist": v1}])
    cfg2 = node_config(node, [{"name": "blue", "default": True, "conflist": v2}])
    write_config(node, cfg1)
    p1 = pod_message(new_pod_id(), ns1.path)
    p2 = pod_message(new_pod_id(), ns2.path)

    async def scenario():
        async with DaemonHarness(node, cfg1) as h:
            await h.runtime.run_pod_sandbox(p1)
            await reconfigure(h, node, cfg2)
            assert node.lc.seq() == [("INIT", gen_of(v1)), ("INIT", gen_of(v2))]
            await h.runtime.run_pod_sandbox(p2)  # the new generation
            await h.runtime.stop_pod_sandbox(p1)  # DEL with v1, from the cache
            await h.runtime.remove_pod_sandbox(p1)
            await until(
                lambda: not h.daemon.reports.status()["lifecycle"]["blue"]["retired"], what="DEINIT of v1"
            )
            assert await bridge_exists(bridge)  # v2 names the same bridge and is live: kept
            await h.runtime.stop_pod_sandbox(p2)
            await h.runtime.remove_pod_sandbox(p2)

    run(scenario())
    calls = node.lc.all()
    by_pod = {
        (c["command"], c["env"]["CNI_CONTAINERID"]): c["tag"] for c in calls if c["command"] in ("ADD", "DEL")
    }
    assert by_pod == {("ADD", p1.id): "v1", ("DEL", p1.id): "v1", ("ADD", p2.id): "v2", ("DEL", p2.id): "v2"}
    deinit = calls[index_of(calls, "DEINIT", "blue")]
    assert deinit["tag"] == "v1" and deinit["others"] == [gen_of(v2)] and deinit.get("kept") is None
    assert any(c.get("kept") for c in calls)
    assert node.reservations() == []


def test_pods_fail_with_the_init_error_until_a_retry_succeeds_and_nothing_leaks(lnode):
    node = lnode
    ns = node.jan.netns()
    bridge = unique_name("lb")
    blue = lifecycle_net(node, "blue", "10.245.4.0/24", bridge, fail_init=2)
    cfg = node_config(
        node,
        [{"name": "blue", "default": True, "conflist": blue}],
        failure_policy="fail",
        lifecycle={"retry_initial": "1s", "retry_max": "2s"},
    )
    write_config(node, cfg)
    pod = pod_message(new_pod_id(), ns.path)
    checker = node.leak_checker(ns).start()
    checker.add_markers(pod.id)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            with pytest.raises(RPCError) as err:
                await h.runtime.run_pod_sandbox(pod)
            assert "network 'blue' is not ready: INIT failed" in str(err.value)
            assert "fails on purpose" in str(err.value)
            assert node.lc.verbs("ADD") == []  # no plugin ran for the pod
            status = h.daemon.reports.status()
            assert status["ready"] is False and status["networks"]["blue"]["ready"] is False
            assert "INIT failed" in status["networks"]["blue"]["error"]
            with pytest.raises(CNIError) as st:  # the shim's CNI STATUS
                h.daemon.readiness.check()
            assert st.value.code == CniCode.PLUGIN_NOT_AVAILABLE
            code, payload = await asyncio.to_thread(  # `nri-cni status` over the local socket
                localproto.call, str(node.tmp / "daemon.sock"), {localproto.OP_KEY: "status"}
            )
            assert code == 0 and b"INIT failed" in payload

            await until(
                lambda: h.daemon.reports.status()["networks"]["blue"]["ready"],
                timeout=15,
                what="INIT retried until it succeeds",
            )
            h.daemon.readiness.check()
            resp = await h.runtime.run_pod_sandbox(pod)  # the runtime's retry of the pod
            checker.add_markers(*resp.adjust.network.ips)
            await asyncio.to_thread(checker.learn)
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)

    run(scenario())
    assert [c for c, _ in node.lc.seq()] == ["INIT", "INIT", "INIT"]
    assert len(node.lc.verbs("ADD")) == 1
    assert node.reservations() == []
    assert checker.leaks() == []


def test_a_malformed_config_written_while_pods_run_is_refused_and_pods_keep_working(lnode, caplog):
    node = lnode
    ns1, ns2 = node.jan.netns(), node.jan.netns()
    bridge = unique_name("lb")
    blue = lifecycle_net(node, "blue", "10.245.5.0/24", bridge)
    cfg = node_config(node, [{"name": "blue", "default": True, "conflist": blue}])
    write_config(node, cfg)
    path = node.tmp / "config.yaml"
    p1 = pod_message(new_pod_id(), ns1.path)
    p2 = pod_message(new_pod_id(), ns2.path)

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(p1)
            running = h.daemon.cfg
            path.write_text(path.read_text() + "networks: [oops\n")  # written in place, broken
            await until(lambda: h.daemon.reloader.state.refused, what="refusal")
            refused = h.daemon.reports.status()["reload"]["refused"]
            assert refused.startswith(f"{path}:") and "not valid YAML" in refused
            assert h.daemon.cfg is running

            bad = node_config(
                node,
                [
                    {"name": "blue", "default": True, "conflist": blue},
                    {
                        "name": "nope",
                        "conflist": {"cniVersion": "1.1.0", "name": "x", "plugins": [{"type": "bridge"}]},
                    },
                ],
            )
            write_config(node, bad)  # parses, does not validate: refused as a whole
            await until(
                lambda: "networks[1].conflist" in h.daemon.reloader.state.refused, what="second refusal"
            )
            assert h.daemon.cfg is running

            resp = await h.runtime.run_pod_sandbox(p2)  # pods keep working on the running config
            assert resp.adjust.network.ips
            for pod in (p1, p2):
                await h.runtime.stop_pod_sandbox(pod)
                await h.runtime.remove_pod_sandbox(pod)
            await h.daemon.lifecycle.idle()

    run(scenario())
    assert f"{path}:" in caplog.text
    assert node.lc.seq() == [("INIT", gen_of(blue))]
    assert node.reservations() == []


def test_deinit_of_a_removed_network_follows_the_gc_of_a_pod_the_runtime_lost(lnode):
    node = lnode
    ns = node.jan.netns()
    br_blue, br_green = unique_name("lb"), unique_name("lg")
    blue = lifecycle_net(node, "blue", "10.245.6.0/24", br_blue)
    green = lifecycle_net(node, "green", "10.245.7.0/24", br_green)
    both = node_config(
        node,
        [
            {"name": "blue", "default": True, "conflist": blue},
            {"name": "green", "namespaces": ["default"], "conflist": green},
        ],
    )
    only_blue = node_config(node, [{"name": "blue", "default": True, "conflist": blue}])
    write_config(node, both)
    pod = pod_message(new_pod_id(), ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "green"})

    async def scenario():
        async with DaemonHarness(node, both) as h:
            await h.runtime.run_pod_sandbox(pod)
        write_config(node, only_blue)  # changed while nri-cni is down
        # back up: the runtime lost the pod meanwhile, GC (on Synchronize) DELs it, then DEINIT
        async with DaemonHarness(node, only_blue, pods=[]) as h:
            await until(lambda: "green" not in h.daemon.reports.status()["lifecycle"], what="DEINIT of green")
            assert not await bridge_exists(br_green)

    run(scenario())
    calls = node.lc.all()
    dels = [i for i, c in enumerate(calls) if c["command"] == "DEL" and c["name"] == "green"]
    assert dels and max(dels) < index_of(calls, "DEINIT", "green")
    assert node.lc.seq("green") == [("INIT", gen_of(green)), ("DEINIT", gen_of(green))]
    assert node.lc.seq("blue") == [("INIT", gen_of(blue))]
    assert node.reservations() == []
