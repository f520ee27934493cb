"""Ids and paths: what the runtime's CNI environment carries (container id, CNI_ARGS,
CNI_IFNAME) and what a GC names is validated before it reaches a file, a plugin or a log. Each
test drives the shim exec'd as a runtime execs a plugin, against a running daemon, and checks
that the daemon still serves a normal ADD/DEL afterwards."""

from __future__ import annotations

import json
import logging

import pytest

from tests.support.harness import new_pod_id, run
from tests.support.secharness import (
    BUILDS,
    all_files,
    call_shim,
    install_shim,
    netns_path,
    normal_add_del,
    pod_calls,
    runtime_conf,
    shim_config,
    started,
)

pytestmark = pytest.mark.netns  # a daemon, network namespaces, root


def _refused(code, out, raw, needle: str) -> None:
    assert code == 1, raw
    assert out is not None and out["code"] == 4, raw
    assert needle in out["msg"], raw


@BUILDS
def test_container_ids_that_name_paths_touch_nothing(node, compiled, caplog):
    victim = node.tmp / "victim"
    outside = node.tmp / "outside"
    outside.mkdir()

    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            victim.write_text("precious")
            before = all_files(node.tmp)
            netns = netns_path(node)
            for cid in ("../../victim", "../../outside/new", str(outside / "abs"), ".", "..", "a/b", "x\ny"):
                for command in ("ADD", "DEL", "CHECK"):
                    code, out, raw = await call_shim(shim, command, cid, netns=netns)
                    _refused(code, out, raw, "CNI_CONTAINERID")
            assert victim.read_text() == "precious"
            assert all_files(node.tmp) - before <= {"fake.log"}
            assert not pod_calls(node), "no plugin may run for an invalid id"
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    with caplog.at_level(logging.ERROR, logger="nri_cni"):
        run(scenario())
    # logged whole and escaped, not cut to 12 characters
    assert any(repr(str(outside / "abs")) in r.getMessage() for r in caplog.records)
    assert any("'x\\ny'" in r.getMessage() for r in caplog.records)


@BUILDS
def test_cni_args_value_with_equals_leaves_no_intent_record(node, compiled):
    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            cid = new_pod_id()
            netns = netns_path(node)
            for args in ("K8S_POD_NAME=web=1", "K8S_POD_NAMESPACE=a;b", "K8S_POD_NAME=a b", "=x", "noequals"):
                code, out, raw = await call_shim(shim, "ADD", cid, netns=netns, CNI_ARGS=args)
                _refused(code, out, raw, "CNI_ARGS")
            intents = node.state_dir / "intents"
            assert not intents.exists() or not list(intents.iterdir())
            assert not pod_calls(node)
            await normal_add_del(shim, node, cid)
        finally:
            await h.stop()

    run(scenario())


@BUILDS
def test_interface_names_checked_in_bytes_and_for_control_characters(node, compiled):
    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        h = await started(node, node.config("shim", _two_nets(node)))
        try:
            shim = install_shim(node, compiled)
            netns = netns_path(node)
            bad = ["eth\x01", "é" * 9, "a" * 16, "eth 0", "\u200bx"]
            for ifname in bad:
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns, CNI_IFNAME=ifname)
                _refused(code, out, raw, "CNI_IFNAME")
                annotation = json.dumps([{"name": "extra", "interface": ifname}])
                conf = runtime_conf({"k8s.v1.cni.cncf.io/networks": annotation})
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns, conf=conf)
                assert code == 1 and out["code"] == 7 and "interface name" in out["msg"], raw
            for ifname in ("eth\x00", "a/b", ".."):  # NUL: only an annotation can carry it
                conf = runtime_conf(
                    {"k8s.v1.cni.cncf.io/networks": json.dumps([{"name": "extra", "interface": ifname}])}
                )
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns, conf=conf)
                assert code == 1 and out["code"] == 7 and "interface name" in out["msg"], raw
            assert not pod_calls(node)
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


def _two_nets(node) -> list[dict]:
    from tests.support.secharness import fake_net

    return [fake_net(node), fake_net(node, "extra", default=False, namespaces=["default"])]


@BUILDS
def test_one_network_is_not_attached_many_times_and_networks_per_pod_are_capped(node, compiled):
    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        nets = _two_nets(node)
        h = await started(node, node.config("shim", nets))
        try:
            shim = install_shim(node, compiled)
            netns = netns_path(node)
            many = ",".join(f"extra@net{i}" for i in range(1, 30))
            for annotation in ("extra@net1,extra@net2,extra@net3", many):
                conf = runtime_conf({"k8s.v1.cni.cncf.io/networks": annotation})
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns, conf=conf)
                assert code == 1 and out["code"] == 7 and "limits." in out["msg"], raw
            assert not pod_calls(node)
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


@BUILDS
def test_malformed_gc_valid_list_is_refused_and_deletes_nothing(node, compiled):
    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            cid = new_pod_id()
            netns = netns_path(node)
            code, _, raw = await call_shim(shim, "ADD", cid, netns=netns)
            assert code == 0, raw
            cached = sorted(p.name for p in (node.cache_dir / "results").iterdir())
            for valid in (
                {"containerID": cid, "ifname": "eth0"},
                [cid],
                [{"containerID": 5, "ifname": "eth0"}],
                [{"containerID": "../x", "ifname": "eth0"}],
                "everything",
            ):
                code, out, raw = await call_shim(
                    shim, "GC", "", conf=runtime_conf(**{"cni.dev/valid-attachments": valid})
                )
                _refused(code, out, raw, "valid-attachments")
                assert sorted(p.name for p in (node.cache_dir / "results").iterdir()) == cached
            assert [c["command"] for c in pod_calls(node)] == ["ADD"]
            code, _, raw = await call_shim(
                shim,
                "GC",
                "",
                conf=runtime_conf(**{"cni.dev/valid-attachments": [{"containerID": cid, "ifname": "eth0"}]}),
            )
            assert code == 0, raw
            assert sorted(p.name for p in (node.cache_dir / "results").iterdir()) == cached
            code, _, raw = await call_shim(shim, "DEL", cid, netns=netns)
            assert code == 0, raw
        finally:
            await h.stop()

    run(scenario())


def test_quoted_input_in_errors_is_escaped_and_cut(node):
    netns_path(node)  # made before the event loop runs (pyroute2 has a loop of its own)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, True)
            netns = netns_path(node)
            huge = "\x01" * 60_000
            conf = runtime_conf({"k8s.v1.cni.cncf.io/networks": huge})
            code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns, conf=conf)
            assert code == 1 and len(raw) < 4096, len(raw)
            code, out, raw = await call_shim(
                shim, "ADD", new_pod_id(), netns=netns, CNI_IFNAME="\x01" * 20000
            )
            assert code == 1 and len(raw) < 4096, len(raw)
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


def test_nri_pod_events_with_path_ids_are_refused_and_touch_nothing(node):
    from nri_cni.errors import GrpcCode, RPCError
    from tests.support.harness import DaemonHarness, pod_message

    netns = netns_path(node)
    victim = node.tmp / "victim"
    victim.write_text("precious")
    cfg = node.config("native", [_two_nets(node)[0]])

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            before = all_files(node.tmp)
            for pod_id in ("../../victim", str(victim), ".."):
                pod = pod_message(pod_id, netns, name="web")
                for call in (
                    h.runtime.run_pod_sandbox,
                    h.runtime.stop_pod_sandbox,
                    h.runtime.remove_pod_sandbox,
                ):
                    try:
                        await call(pod)
                    except RPCError as exc:
                        assert exc.code == GrpcCode.INVALID_ARGUMENT and "pod id" in str(exc), exc
                    else:
                        raise AssertionError(f"{call.__name__} accepted pod id {pod_id!r}")
            bad_name = pod_message(new_pod_id(), netns, name="web=1")
            try:
                await h.runtime.run_pod_sandbox(bad_name)
            except RPCError as exc:
                assert exc.code == GrpcCode.INVALID_ARGUMENT and "pod name" in str(exc), exc
            else:
                raise AssertionError("a pod name with '=' was accepted")
            assert victim.read_text() == "precious"
            assert all_files(node.tmp) - before <= {"fake.log"}
            assert not pod_calls(node)
            good = pod_message(new_pod_id(), netns)
            await h.runtime.run_pod_sandbox(good)
            await h.runtime.stop_pod_sandbox(good)
            await h.runtime.remove_pod_sandbox(good)
            assert [c["command"] for c in pod_calls(node)] == ["ADD", "DEL"]

    run(scenario())
