"""Documents with no bounds: deep JSON in the shim's stdin, in an annotation and in a
plugin's output, and deep or exploding documents in the config files. Each is refused with an
error that names the limit; the daemon keeps answering, and hot reload keeps applying later
valid changes. Property tests push random bytes and extreme depths through every parser. (issue 15)"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.config import load_config_text
from nri_cni.errors import ConfigError
from nri_cni.safety import jsonlimits
from tests.support.harness import new_pod_id, run
from tests.support.secharness import (
    BUILDS,
    call_shim,
    fake_net,
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


BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


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


def test_check_config_refuses_an_alias_bomb_without_expanding_it():
    with pytest.raises(ConfigError) as err:
        load_config_text(BOMB, "/x/config.yaml")
    assert "aliases" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config_text("a: " + "[" * 100_000, "/x/config.yaml")
    assert "nested deeper" in str(err.value)


# -- property tests of the parsers at the edge ---------------------------------------------


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=_json_values)
def test_jsonlimits_reads_what_json_reads_within_the_limits(value):
    text = json.dumps(value)
    assert jsonlimits.loads(text) == json.loads(text)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.integers(0, 200_000).map(lambda n: b"[" * n),
        st.integers(60, 70).map(lambda n: b"[" * n + b"]" * n),
        st.integers(0, 5_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.integers(1, 3000).map(lambda n: b'["\\"[' * n),
    )
)
def test_jsonlimits_raises_only_valueerror_on_any_bytes(data):
    try:
        value = jsonlimits.loads(data)
    except ValueError:
        return
    assert value == json.loads(data)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.integers(0, 20_000).map(lambda n: "a: " + "[" * n),
        st.integers(0, 3_000).map(lambda n: "- " * n + "x"),
        st.just(BOMB),
    )
)
def test_config_loader_raises_only_config_errors_on_any_text(text):
    try:
        load_config_text(text, "/x/config.yaml")
    except ConfigError:
        pass


@pytest.mark.netns
def test_the_daemon_answers_while_random_requests_hit_the_local_socket(node):
    """Random and extreme requests on the local socket, interleaved with normal ADD/DELs."""
    from nri_cni.local import proto as localproto

    netns_path(node)
    shim_holder = {}

    async def scenario():
        h = await started(node, node.config("shim", [fake_net(node)]))
        try:
            shim_holder["shim"] = install_shim(node, True)
            sock = str(node.tmp / "daemon.sock")
            bodies = [
                b"\xff" * 64,
                localproto.encode_request({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "a"}, b"[" * 100_000),
                localproto.encode_request({"CNI_COMMAND": "GC"}, b'{"cni.dev/valid-attachments":{}}'),
                localproto.encode_request({"NRICNI_OP": "nope"}),
                b"\x00\x00\x00\x05CNI_C",  # half a request, then the client goes away
            ]
            for body in bodies:
                reader, writer = await asyncio.open_unix_connection(sock)
                writer.write(body)
                await writer.drain()
                writer.close()
                await normal_add_del(shim_holder["shim"], node, new_pod_id())
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


def test_check_config_refuses_an_alias_bomb_as_a_command(tmp_path):
    """`nri-cni check-config` on the 600-byte alias bomb: a located error, exit 2, at once."""
    import resource
    import subprocess
    import sys

    path = tmp_path / "config.yaml"
    # the bomb inside an inline conflist, whose JSON text the old loader built: 9**9 strings
    anchors = "".join("    " + line + "\n" for line in BOMB.splitlines())
    path.write_text(
        "networks:\n- name: podnet\n  default: true\n  conflist:\n"
        + anchors
        + "    cniVersion: 1.1.0\n    name: podnet\n    plugins: [{type: bridge, x: *i}]\n"
    )

    def limit_memory():  # the old loader needed gigabytes here
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_memory,
    )
    assert proc.returncode == 2, proc.stderr
    assert "aliases" in proc.stderr and f"{path}:6:" in proc.stderr, proc.stderr
