"""Documents with no bounds reaching a running daemon: deep JSON in the shim's stdin, in an
annotation and in a plugin's output, a runtime config that is not an object, and deep or
exploding documents in the config files. Each is refused with an error that names the limit (a
decoding error, not a dead request); a failed ADD leaves nothing; the daemon keeps answering, and
hot reload keeps applying later valid changes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import yaml

from tests.support.harness import new_pod_id, run
from tests.support.secharness import (
    BOMB,
    BUILDS,
    call_shim,
    install_shim,
    netns_path,
    normal_add_del,
    pod_calls,
    runtime_conf,
    shim_config,
    started,
)

DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.netns
@BUILDS
def test_deep_json_in_stdin_and_annotation_is_a_decoding_error_not_a_dead_request(node, compiled):
    netns_path(node)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            netns = netns_path(node)
            bodies = [
                json.dumps(runtime_conf({"k8s.v1.cni.cncf.io/networks": DEEP})).encode(),
                b'{"cniVersion":"1.0.0","name":"n","type":"nri-cni-shim","x":' + DEEP.encode() + b"}",
                b'{"cniVersion":"1.0.0","x":' + b"[" * 100_000,
            ]
            for body in bodies:
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), conf=body, netns=netns)
                assert code == 1 and out is not None, raw
                assert out["code"] in (6, 7) and "nested deeper" in out["msg"] + out.get("details", ""), raw
            assert not pod_calls(node)
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


@pytest.mark.netns
@BUILDS
def test_a_runtime_config_that_is_not_an_object_is_a_decoding_error(node, compiled):
    netns_path(node)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            for rc in ([1], "x", 5, True):
                body = json.dumps({"cniVersion": "1.0.0", "runtimeConfig": rc}).encode()
                code, out, raw = await call_shim(shim, "ADD", new_pod_id(), conf=body, netns=netns_path(node))
                assert code == 1 and out is not None and out["code"] == 6, raw
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


@pytest.mark.netns
def test_deep_plugin_output_fails_the_add_and_leaves_nothing(node):
    netns_path(node)
    deep_net = {
        "name": "podnet",
        "default": True,
        "conflist": {
            "cniVersion": "1.1.0",
            "name": "podnet",
            "plugins": [node.fake("fake-ok", ADD={"print": '{"cniVersion":"1.1.0","x":' + DEEP + "}"})],
        },
    }

    async def scenario():
        h = await started(node, node.config("shim", [deep_net]))
        try:
            shim = install_shim(node, True)
            netns = netns_path(node)
            cid = new_pod_id()
            code, out, raw = await call_shim(shim, "ADD", cid, netns=netns)
            assert code == 1 and out is not None and out["code"] != 11, raw
            assert "nested deeper" in out["msg"] + out.get("details", ""), raw
            assert [c["command"] for c in pod_calls(node)] == ["ADD", "DEL"]  # rolled back
            results = node.cache_dir / "results"
            assert not results.exists() or not list(results.iterdir())
            intents = node.state_dir / "intents"
            assert not intents.exists() or not list(intents.iterdir())
        finally:
            await h.stop()

    run(scenario())


def _write(node, text: str, name: str = "config.yaml") -> None:
    tmp = node.tmp / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(node.tmp / name)


async def _until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        await asyncio.sleep(0.02)


@pytest.mark.netns
def test_hot_reload_survives_deep_json_deep_yaml_and_alias_bombs(node):
    netns_path(node)
    conflist = node.tmp / "podnet.conflist"
    body = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [node.fake("fake-ok")]}
    conflist.write_text(json.dumps(body))
    cfg = node.config(
        "shim",
        [{"name": "podnet", "default": True, "file": str(conflist)}],
        reload={"watch": True, "rescan_interval": 0, "debounce": "50ms"},
    )
    _write(node, yaml.safe_dump(cfg))

    async def scenario():
        h = await started(node, cfg)
        try:
            state = h.daemon.reloader.state
            shim = install_shim(node, True)
            bad_inputs = [
                ("podnet.conflist", '{"cniVersion":"1.1.0","name":"podnet","plugins":' + DEEP + "}"),
                ("config.yaml", "a: " + "[" * 5000 + "]" * 5000),
                ("config.yaml", BOMB),
                ("config.yaml", "a: " + "{x: " * 3000 + "1" + "}" * 3000),
            ]
            for name, text in bad_inputs:
                refused = state.refused_at
                _write(node, text, name)
                await _until(lambda r=refused: state.refused_at != r, f"refusal of {name}")
                assert h.daemon.reloader._tasks and not any(t.done() for t in h.daemon.reloader._tasks)
                await normal_add_del(shim, node, new_pod_id())
            # restore valid files, then a valid change is still applied: the tasks are alive
            conflist.write_text(json.dumps(body))
            applied = state.applied
            _write(node, yaml.safe_dump({**cfg, "repair_on_sync": False}))
            await _until(lambda: state.applied > applied, "a valid change applied")
            assert h.daemon.cfg.repair_on_sync is False
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())
