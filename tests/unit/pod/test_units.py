"""Unit tests of the pod plan's pure parts: config, network selection, locks, intents, the local
socket protocol and the shim program."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from nri_cni.config import ConfigErrors, load_config_text, parse_config
from nri_cni.errors import AnnotationRefused, ConfigError
from nri_cni.local import proto as localproto
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import PrimaryNetwork
from nri_cni.pod.select import select_networks
from nri_cni.service.modes import mode_for
from nri_cni.shim import install

BRIDGE = {
    "cniVersion": "1.1.0",
    "name": "podnet",
    "plugins": [{"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}}],
}


def _net(name, **kw):
    conf = dict(BRIDGE, name=name)
    return {"name": name, "conflist": conf, **kw}


def _cfg(networks, **extra):
    return parse_config({"networks": networks, **extra}, "/etc/nri-cni/config.yaml")


# -- config ------------------------------------------------------------------------------------


def test_config_errors_are_located_and_all_reported():
    doc = {
        "mode": "sideways",
        "nri": {"plugin_index": "7", "socket": "relative/path"},
        "cni": {"plugin_timeout": "soon"},
        "networks": [
            _net("podnet", default=True),
            _net("podnet"),
            {"name": "x", "file": "/nonexistent.conflist"},
            {"name": "bad/name", "conflist": BRIDGE},
        ],
        "colour": "blue",
    }
    with pytest.raises(ConfigErrors) as err:
        parse_config(doc, "/etc/nri-cni/config.yaml")
    text = str(err.value)
    for where in (
        "mode",
        "nri.plugin_index",
        "nri.socket",
        "cni.plugin_timeout",
        "networks[1].name",
        "networks[2].file",
        "networks[3].name",
        "colour",
    ):
        assert f"config.yaml: {where}" in text, (where, text)


def test_yaml_syntax_error_names_line_and_column():
    with pytest.raises(ConfigError) as err:
        load_config_text("mode: shim\nnetworks: [\n", "/x/config.yaml")
    assert "/x/config.yaml:3:1" in str(err.value) or "/x/config.yaml:2" in str(err.value)


def test_inline_conflist_must_match_its_name_and_have_bare_plugin_types():
    with pytest.raises(ConfigError) as err:
        _cfg(
            [
                {
                    "name": "podnet",
                    "default": True,
                    "conflist": dict(BRIDGE, plugins=[{"type": "../../bin/sh"}]),
                }
            ]
        )
    assert "networks[0].conflist" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _cfg([{"name": "other", "default": True, "conflist": BRIDGE}])
    assert "named 'podnet'" in str(err.value)


def test_defaults_and_durations():
    cfg = _cfg(
        [_net("podnet", default=True)],
        gc={"interval": "2m"},
        nri={"plugin_index": 5, "request_timeout": "1500ms"},
    )
    assert cfg.mode == "shim" and cfg.gc_interval == 120 and cfg.nri.plugin_index == "05"
    assert cfg.nri.request_timeout == 1.5
    assert cfg.primary.name == "podnet"
    assert cfg.cni.cache_dir == "/var/lib/cni/nri-cni"


def test_metrics_listen_only_local():
    with pytest.raises(ConfigError) as err:
        _cfg([_net("podnet", default=True)], metrics={"listen": "0.0.0.0:9100"})
    assert "metrics.listen" in str(err.value)
    assert _cfg([_net("podnet", default=True)], metrics={"listen": "127.0.0.1:9100"}).metrics_listen


# -- selection ---------------------------------------------------------------------------------


def _sel_cfg(mode="native"):
    return _cfg(
        [
            _net("podnet", default=True),
            _net("fast", namespaces=["default"]),
            _net("storage", namespaces=["*"], interface="stor0"),
            _net("admin", namespaces=["kube-system"]),
        ],
        mode=mode,
        **({"primary_network": "cbr0"} if mode == "secondary" else {}),
    )


def test_defaults_then_requests_with_interface_names():
    cfg = _sel_cfg()
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast, storage, fast@fast2"})
    assert [(s.network.name, s.ifname) for s in sel] == [
        ("podnet", "eth0"),
        ("fast", "net1"),
        ("storage", "stor0"),
        ("fast", "fast2"),
    ]


def test_json_form_with_ips_and_mac():
    cfg = _sel_cfg()
    ann = json.dumps(
        [
            {
                "name": "fast",
                "interface": "f0",
                "ips": ["10.244.9.9/24"],
                "mac": "02:00:00:00:00:01",
                "namespace": "default",
            }
        ]
    )
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": ann})
    assert sel[1].ifname == "f0"
    assert sel[1].capability_args == {"ips": ["10.244.9.9/24"], "mac": "02:00:00:00:00:01"}


@pytest.mark.parametrize(
    "value",
    [
        "admin",  # allowed only in kube-system
        "nosuchnet",
        "../etc",
        "/etc/cni/net.d/x.conflist",
        "fast@eth0/x",
        "fast@" + "x" * 16,
        "podnet",  # default networks cannot be asked for again
        "fast@eth0",  # clashes with the primary's interface
        "other/fast",  # another namespace
        '[{"name": "fast", "ips": ["not-an-ip"]}]',
        '[{"name": "fast", "mac": "zz"}]',
        '[{"name": "fast", "cni-args": {"a": "b"}}]',
        '{"name": "fast"}',
        "[not json",
        ",".join(["fast"] * 40),
    ],
)
def test_untrusted_annotations_are_refused(value):
    with pytest.raises(AnnotationRefused):
        select_networks(_sel_cfg(), "default", {"k8s.v1.cni.cncf.io/networks": value})


def test_secondary_mode_leaves_eth0_to_the_runtime():
    cfg = _sel_cfg("secondary")
    theirs = mode_for(cfg).primary
    assert theirs == PrimaryNetwork("cbr0", ours=False)
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast"}, primary=theirs)
    assert [(s.network.name, s.ifname) for s in sel] == [("podnet", "net1"), ("fast", "net2")]
    with pytest.raises(AnnotationRefused):
        select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast@eth0"}, primary=theirs)


def test_primary_network_comes_first_as_eth0_in_every_mode_that_owns_it():
    nets = [_net("podnet", default=True), _net("pods2", default=True), _net("fast", namespaces=["*"])]
    for mode in ("native", "shim"):
        cfg = _cfg(nets, mode=mode, primary_network="pods2")
        primary = mode_for(cfg).primary
        assert primary == PrimaryNetwork("pods2", ours=True)
        sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast"}, primary=primary)
        assert [(s.network.name, s.ifname) for s in sel] == [
            ("pods2", "eth0"),
            ("podnet", "net1"),
            ("fast", "net2"),
        ]
        # without primary_network: the first default network
        cfg = _cfg(nets, mode=mode)
        sel = select_networks(cfg, "default", {}, primary=mode_for(cfg).primary)
        assert [(s.network.name, s.ifname) for s in sel] == [("podnet", "eth0"), ("pods2", "net1")]


# -- locks -------------------------------------------------------------------------------------


def test_one_pod_serialized_pods_parallel_gc_exclusive():
    async def scenario():
        locks = PodLocks()
        spans: list[tuple[str, float, float]] = []

        async def op(pod, name, hold=0.02):
            async with locks.pod(pod):
                t0 = time.monotonic()
                await asyncio.sleep(hold)
                spans.append((name, t0, time.monotonic()))

        async def gc():
            async with locks.exclusive():
                t0 = time.monotonic()
                await asyncio.sleep(0.02)
                spans.append(("gc", t0, time.monotonic()))

        await asyncio.gather(op("a", "a1"), op("a", "a2"), op("b", "b1"), gc(), op("b", "b2"))
        by = {n: (s, e) for n, s, e in spans}

        def overlap(x, y):
            return by[x][0] < by[y][1] and by[y][0] < by[x][1]

        assert not overlap("a1", "a2") and not overlap("b1", "b2")
        assert overlap("a1", "b1")  # different pods in parallel
        for name in ("a1", "a2", "b1", "b2"):
            assert not overlap("gc", name)
        assert len(locks) == 0  # nothing kept for pods that are gone

    asyncio.run(scenario())


# -- intents -----------------------------------------------------------------------------------


def test_intent_round_trip_and_damaged_records(tmp_path):
    store = IntentStore(str(tmp_path))
    intent = Intent(
        "pod1",
        "/var/run/netns/x",
        [IntendedNetwork("podnet", "eth0", b'{"name":"podnet"}', [("K8S_POD_NAME", "web")], {"a": 1})],
    )
    store.write(intent)
    assert oct(os.stat(tmp_path / "intents" / "pod1").st_mode & 0o777) == "0o600"
    (tmp_path / "intents" / "pod2").write_text("{garbage")
    (tmp_path / "intents" / "pod3.tmp").write_text("half")
    loaded = store.load_all()
    assert loaded == [intent]
    assert sorted(os.listdir(tmp_path / "intents")) == ["pod1"]
    store.clear("pod1")
    store.clear("pod1")
    assert store.load_all() == []


# -- local protocol and the shim ---------------------------------------------------------------


def test_local_protocol_round_trip_and_limits():
    async def scenario():
        reader = asyncio.StreamReader()
        reader.feed_data(localproto.encode_request({"CNI_COMMAND": "ADD", "CNI_ARGS": "a=b;c=d"}, b"{}"))
        reader.feed_eof()
        header, body = await localproto.read_request(reader)
        assert header == {"CNI_COMMAND": "ADD", "CNI_ARGS": "a=b;c=d"} and body == b"{}"
        for raw in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"\x00\x00\x00\x01x\x00\x00\x00\x00"):
            reader = asyncio.StreamReader()
            reader.feed_data(raw)
            reader.feed_eof()
            with pytest.raises(localproto.LocalProtocolError):
                await localproto.read_request(reader)

    asyncio.run(scenario())


# large enough that the shim reads it in several pieces
ANSWER = b'{"cniVersion":"1.0.0","pad":"' + b"x" * 300_000 + b'"}'
BUILDS = pytest.mark.parametrize("compiled", [True, False], ids=["c", "script"])


def _shim(tmp_path, sock, env, stdin: bytes, compiled: bool):
    path = install(str(tmp_path / "bin"), str(sock), compiled=compiled)
    return subprocess.run([path], input=stdin, env=env, capture_output=True, timeout=10)


@BUILDS
def test_shim_answers_version_and_reports_a_missing_daemon(tmp_path, compiled):
    out = _shim(
        tmp_path, tmp_path / "none.sock", {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}', compiled
    )
    assert out.returncode == 0 and "1.1.0" in json.loads(out.stdout)["supportedVersions"]
    out = _shim(
        tmp_path,
        tmp_path / "none.sock",
        {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x"},
        b'{"cniVersion":"0.4.0","name":"n","type":"nri-cni-shim"}',
        compiled,
    )
    err = json.loads(out.stdout)
    assert out.returncode == 1
    assert err == {
        "cniVersion": "0.4.0",
        "code": 11,
        "details": "No such file or directory",
        "msg": f"nri-cni daemon is not reachable at {tmp_path / 'none.sock'}",
    }


@BUILDS
def test_shim_forwards_env_and_stdin_and_prints_the_answer(tmp_path, compiled):
    sock = tmp_path / "d.sock"
    seen = {}

    async def scenario():
        async def serve(reader, writer):
            seen["header"], seen["body"] = await localproto.read_request(reader)
            writer.write(localproto.encode_response(0, ANSWER))
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(serve, path=str(sock))
        conf = b'{"cniVersion":"1.0.0","name":"n","type":"nri-cni-shim","daemonSocket":"%s"}' % (
            str(sock).encode()
        )
        env = {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "abc",
            "CNI_ARGS": "K8S_POD_NAME=a;b=c",
            "OTHER": "not forwarded",
        }
        path = install(str(tmp_path / "bin"), "/nonexistent/default.sock", compiled=compiled)
        proc = await asyncio.create_subprocess_exec(
            path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        out, _ = await proc.communicate(conf)
        server.close()
        return proc.returncode, out, conf

    code, out, conf = asyncio.run(scenario())
    assert code == 0 and out == ANSWER
    assert seen["header"] == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc",
        "CNI_ARGS": "K8S_POD_NAME=a;b=c",
    }
    assert seen["body"] == conf
