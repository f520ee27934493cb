"""The verbs over fake plugins: what each plugin is given, in which order, and the cache. The
plugins answer in-process (FakeExecutor); a process only where its timeout is the subject."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from nri_cni.cni.config import PluginConf, parse_conflist
from nri_cni.cni.exec import PluginExecutor, PluginOutput
from nri_cni.cni.executor import FAKE_BIN, FakeExecutor
from nri_cni.cni.result_parse import parse_result
from nri_cni.cni.runtime import Attachment, CNIRuntime, GCError, RuntimeConf
from nri_cni.errors import CniCode, CNIError, ConfigError, PluginExecError, PluginTimeout
from tests.support.golden_cache import GOLDEN

CNI_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def run(coro):
    return asyncio.run(coro)


def cache_file(runtime: CNIRuntime, net: str, rt: RuntimeConf) -> Path:
    return Path(runtime.cache.path(net, rt.container_id, rt.ifname))


def cache_files(runtime: CNIRuntime) -> list[str]:
    """Everything in the results dir, temporary files included."""
    try:
        return sorted(os.listdir(runtime.cache.results_dir))
    except FileNotFoundError:
        return []


def test_add_chain_order_prev_result_env_and_cache(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "fake-b", "fake-c"])
    result = run(runtime.add(net, rt))
    assert [i.name for i in result.interfaces] == ["fake-a", "fake-b", "fake-c"]
    calls = call_log.calls()
    assert [(c["command"], c["type"]) for c in calls] == [
        ("ADD", "fake-a"),
        ("ADD", "fake-b"),
        ("ADD", "fake-c"),
    ]
    assert "prevResult" not in calls[0]["stdin"]
    assert calls[1]["stdin"]["prevResult"] == {"cniVersion": "1.1.0", "interfaces": [{"name": "fake-a"}]}
    assert [i["name"] for i in calls[2]["stdin"]["prevResult"]["interfaces"]] == ["fake-a", "fake-b"]
    for c in calls:
        assert (c["stdin"]["name"], c["stdin"]["cniVersion"]) == ("testnet", "1.1.0")
        env = c["env"]
        assert {k: env[k] for k in CNI_VARS} == {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c0ffee",
            "CNI_NETNS": "/var/run/netns/nct-test",
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
            "CNI_PATH": ":".join(runtime.bin_dirs),
        }
        assert env["PATH"]  # the inherited environment comes along
    entry = runtime.cache.read("testnet", "c0ffee", "eth0")
    assert entry.result == result.to_dict() and entry.config == net.bytes
    assert (
        entry.netns == rt.netns and entry.cni_args == rt.args and entry.capability_args == rt.capability_args
    )


def test_runtime_config_filtered_by_capabilities(runtime, make_net, call_log, rt):
    net = make_net(
        [
            {"type": "fake-a", "capabilities": {"portMappings": True}},
            {"type": "fake-b", "capabilities": {"portMappings": False, "bandwidth": True, "ips": True}},
            {"type": "fake-c", "runtimeConfig": {"own": 1}},
        ]
    )
    run(runtime.add(net, rt))
    got = [c["stdin"].get("runtimeConfig") for c in call_log.calls()]
    assert got == [
        {"portMappings": rt.capability_args["portMappings"]},
        {"bandwidth": {"ingressRate": 1000}},
        {"own": 1},
    ]  # no capability matched: the plugin's own key is left alone


def test_delete_reverse_with_cached_result(runtime, make_net, call_log, rt, caplog):
    net = make_net(["fake-a", "fake-b", "fake-c"])
    result = run(runtime.add(net, rt))
    call_log.clear()
    run(runtime.delete(net, rt))
    calls = call_log.calls()
    assert [(c["command"], c["type"]) for c in calls] == [
        ("DEL", "fake-c"),
        ("DEL", "fake-b"),
        ("DEL", "fake-a"),
    ]
    assert all(c["stdin"]["prevResult"] == result.to_dict() for c in calls)
    assert not cache_file(runtime, "testnet", rt).exists()
    # a repeated DEL is allowed: no cache, no prevResult, a warning
    call_log.clear()
    with caplog.at_level(logging.WARNING):
        run(runtime.delete(net, rt))
    assert len(call_log.calls()) == 3 and all("prevResult" not in c["stdin"] for c in call_log.calls())
    assert "no cached result" in caplog.text


@pytest.mark.parametrize(
    "version,expected",
    [
        ("1.0.0", json.loads(GOLDEN)["result"]),
        (
            "0.4.0",
            {
                "cniVersion": "0.4.0",
                "interfaces": [
                    {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/nct-golden"}
                ],
                "ips": [
                    {"version": "4", "interface": 0, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}
                ],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dns": {},
            },
        ),
        ("0.3.1", None),  # DEL had no prevResult before 0.4.0
    ],
)
def test_delete_consumes_libcni_cache_file(runtime, make_net, call_log, rt, version, expected):
    path = cache_file(runtime, "nct-golden", rt)
    path.parent.mkdir(parents=True)
    path.write_bytes(GOLDEN)
    net = make_net(["fake-a", "fake-b"], name="nct-golden", version=version)
    run(runtime.delete(net, rt))
    assert [c["stdin"].get("prevResult") for c in call_log.calls()] == [expected, expected]
    assert not path.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{garbage",
        json.dumps(
            {
                "kind": "cniCacheV1",
                "containerId": "c0ffee",
                "ifName": "eth0",
                "networkName": "testnet",
                "config": "",
                "result": {"cniVersion": "1.0.0", "ips": [{"address": "not-an-ip"}]},
            }
        ).encode(),
    ],
)
def test_delete_tolerates_corrupt_cache(runtime, make_net, call_log, rt, caplog, content):
    path = cache_file(runtime, "testnet", rt)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    net = make_net(["fake-a", "fake-b"])
    with caplog.at_level(logging.WARNING):
        run(runtime.delete(net, rt))
    assert call_log.summary() == [("DEL", "fake-b"), ("DEL", "fake-a")]
    assert all("prevResult" not in c["stdin"] for c in call_log.calls())
    assert not path.exists()
    assert "corrupt" in caplog.text or "unusable" in caplog.text


def test_corrupt_cache_removed_even_if_delete_fails(runtime, make_net, rt):
    path = cache_file(runtime, "testnet", rt)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{trunc")
    net = make_net([{"type": "fake-a", "fake": {"DEL": {"error": {"code": 11, "msg": "later"}}}}])
    with pytest.raises(CNIError):
        run(runtime.delete(net, rt))
    assert not path.exists()  # as libcni: the bad file goes before the plugins run


def test_failed_delete_keeps_cache(runtime, make_net, rt):
    net = make_net(["fake-a", {"type": "fake-b", "fake": {"DEL": {"error": {"code": 11, "msg": "later"}}}}])
    run(runtime.add(net, rt))
    with pytest.raises(CNIError) as err:
        run(runtime.delete(net, rt))
    assert err.value.code == 11 and (err.value.ref.network, err.value.ref.plugin) == ("testnet", "fake-b")
    assert cache_file(runtime, "testnet", rt).exists()


def test_check(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "fake-b"])
    result = run(runtime.add(net, rt))
    call_log.clear()
    run(runtime.check(net, rt))
    assert call_log.summary() == [("CHECK", "fake-a"), ("CHECK", "fake-b")]
    assert all(c["stdin"]["prevResult"] == result.to_dict() for c in call_log.calls())

    call_log.clear()
    run(runtime.check(dataclasses.replace(net, disable_check=True), rt))
    assert call_log.calls() == []

    failing = make_net(
        ["fake-a", {"type": "fake-b", "fake": {"CHECK": {"error": {"code": 100, "msg": "veth gone"}}}}]
    )
    with pytest.raises(CNIError, match="veth gone") as err:
        run(runtime.check(failing, rt))
    assert (err.value.code, err.value.ref.command) == (100, "CHECK")


def test_check_needs_040(runtime, make_net, call_log, rt):
    with pytest.raises(CNIError, match="does not support the CHECK command") as err:
        run(runtime.check(make_net(["fake-a"], version="0.3.1"), rt))
    assert err.value.code == CniCode.INCOMPATIBLE_VERSION
    assert call_log.calls() == []


@pytest.mark.parametrize("code", [50, 51])
def test_status_codes_surface(runtime, make_net, call_log, code):
    net = make_net(
        [
            "fake-a",
            {
                "type": "fake-b",
                "fake": {
                    "STATUS": {"error": {"code": code, "msg": "plugin not ready", "details": "no leases"}}
                },
            },
            "fake-c",
        ]
    )
    with pytest.raises(CNIError) as err:
        run(runtime.status(net))
    assert (err.value.code, err.value.msg, err.value.details) == (code, "plugin not ready", "no leases")
    assert err.value.ref.plugin == "fake-b"
    assert call_log.summary() == [("STATUS", "fake-a"), ("STATUS", "fake-b")]  # stops at the first error
    first = call_log.calls()[0]
    assert {k: first["env"][k] for k in CNI_VARS[1:5]} == dict.fromkeys(CNI_VARS[1:5], "")
    assert "prevResult" not in first["stdin"] and "runtimeConfig" not in first["stdin"]


def test_status_ok_and_below_110(runtime, make_net, call_log):
    run(runtime.status(make_net(["fake-a", "fake-b"])))
    assert call_log.summary() == [("STATUS", "fake-a"), ("STATUS", "fake-b")]
    call_log.clear()
    failing = {"type": "fake-a", "fake": {"STATUS": {"error": {"code": 50, "msg": "x"}}}}
    run(runtime.status(make_net([failing], version="1.0.0")))  # no STATUS before 1.1.0: ready
    assert call_log.calls() == []


def add_three(runtime, net, rt):
    rts = [
        dataclasses.replace(
            rt,
            container_id=cid,
            ifname=ifname,
            netns=f"/var/run/netns/nct-{cid}",
            args=[("K8S_POD_NAME", f"pod-{cid}")],
        )
        for cid, ifname in (("c1", "eth0"), ("c2", "eth0"), ("c3", "net1"))
    ]
    results = {r.container_id: run(runtime.add(net, r)) for r in rts}
    return rts, results


def test_gc_deletes_stale_then_sends_gc(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "fake-b"])
    other = make_net(["fake-a"], name="othernet")
    rts, results = add_three(runtime, net, rt)
    run(runtime.add(other, dataclasses.replace(rt, container_id="c4")))
    call_log.clear()
    run(runtime.gc(net, [Attachment("c1", "eth0"), Attachment("c9", "eth0")]))
    calls = call_log.calls()
    assert [(c["command"], c["type"], c["env"]["CNI_CONTAINERID"]) for c in calls] == [
        ("DEL", "fake-b", "c2"),
        ("DEL", "fake-a", "c2"),
        ("DEL", "fake-b", "c3"),
        ("DEL", "fake-a", "c3"),
        ("GC", "fake-a", ""),
        ("GC", "fake-b", ""),
    ]
    # stale DELs run with what was cached for them
    c3 = calls[2]
    assert c3["env"]["CNI_NETNS"] == "/var/run/netns/nct-c3" and c3["env"]["CNI_IFNAME"] == "net1"
    assert c3["env"]["CNI_ARGS"] == "IgnoreUnknown=1;K8S_POD_NAME=pod-c3"
    assert c3["stdin"]["prevResult"] == results["c3"].to_dict()
    valid = [{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c9", "ifname": "eth0"}]
    for gc in calls[4:]:
        assert gc["stdin"]["cni.dev/valid-attachments"] == valid
        assert gc["stdin"]["cni.dev/attachments"] == valid
        assert gc["stdin"]["name"] == "testnet" and "prevResult" not in gc["stdin"]
        assert gc["env"]["CNI_ARGS"] == "" and gc["env"]["CNI_NETNS"] == ""
    left = sorted((e.network_name, e.container_id) for e in runtime.cache.entries())
    assert left == [("othernet", "c4"), ("testnet", "c1")]


def test_gc_below_110_and_disabled(runtime, make_net, call_log, rt):
    net = make_net(["fake-a"], version="1.0.0")
    add_three(runtime, net, rt)
    call_log.clear()
    run(runtime.gc(dataclasses.replace(net, disable_gc=True), []))
    assert call_log.calls() == []
    run(runtime.gc(net, [Attachment("c2", "eth0")]))
    # the cache-driven DELs still run; the GC verb does not exist before 1.1.0
    assert [(c["command"], c["env"]["CNI_CONTAINERID"]) for c in call_log.calls()] == [
        ("DEL", "c1"),
        ("DEL", "c3"),
    ]


def test_gc_collects_errors(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", {"type": "fake-b", "fake": {"GC": {"error": {"code": 5, "msg": "disk"}}}}])
    add_three(runtime, net, rt)
    call_log.clear()
    with pytest.raises(GCError) as err:
        run(runtime.gc(net, []))
    assert err.value.code == 5 and len(err.value.errors) == 1 and "disk" in str(err.value)
    assert [c["command"] for c in call_log.calls()] == ["DEL"] * 6 + ["GC", "GC"]
    assert runtime.cache.entries() == []


@pytest.mark.parametrize(
    "args",
    [
        [("K8S_POD_NAME", "web;IP=10.244.9.9")],
        [("K8S_POD_NAME", "a=b")],
        [("K8S POD", "x")],
        [("", "x")],
        [("K8S_POD_NAME", "nul\0")],
    ],
)
def test_cni_args_injection_refused(runtime, make_net, call_log, rt, args):
    bad = dataclasses.replace(rt, args=args)
    net = make_net(["fake-a"])
    for verb in (runtime.add, runtime.delete, runtime.check):
        with pytest.raises(ConfigError, match="CNI_ARGS"):
            run(verb(net, bad))
    assert call_log.calls() == []


def test_ignore_unknown_not_doubled(runtime, make_net, call_log, rt):
    run(runtime.add(make_net(["fake-a"]), dataclasses.replace(rt, args=[("IgnoreUnknown", "true")])))
    assert call_log.calls()[0]["env"]["CNI_ARGS"] == "IgnoreUnknown=true"


def test_add_validates_ids(runtime, make_net, call_log, rt):
    for bad in (dataclasses.replace(rt, container_id="../x"), dataclasses.replace(rt, ifname="a" * 16)):
        with pytest.raises(ConfigError):
            run(runtime.add(make_net(["fake-a"]), bad))
    assert call_log.calls() == []


def test_plugin_type_path_refused(runtime, make_net, rt):
    with pytest.raises(ConfigError, match="bare"):
        make_net(["fake-a", {"type": "../../bin/sh"}])
    # even a hand-built list cannot make the executor run a path
    net = dataclasses.replace(make_net(["fake-a"]), plugins=(PluginConf(type="../../bin/sh", conf={}),))
    with pytest.raises(PluginExecError, match="invalid plugin name"):
        run(runtime.add(net, rt))


def test_missing_binary(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "nct-missing", "fake-b"])
    with pytest.raises(PluginExecError) as err:
        run(runtime.add(net, rt))
    assert "nct-missing" in str(err.value) and runtime.bin_dirs[1] in str(err.value)
    assert err.value.ref.network == "testnet" and err.value.ref.command == "ADD"
    assert call_log.calls() == []  # found missing before fake-a could create anything
    assert not cache_file(runtime, "testnet", rt).exists()
    with pytest.raises(PluginExecError, match="nct-missing"):
        run(runtime.check(net, rt))
    assert call_log.calls() == []
    # DEL undoes what it can, in reverse, up to the missing one (as libcni)
    with pytest.raises(PluginExecError, match="nct-missing"):
        run(runtime.delete(net, rt))
    assert call_log.summary() == [("DEL", "fake-b")]


def in_process(tmp_path: Path, plugins: dict) -> CNIRuntime:
    """A runtime whose plugins answer in-process (FakeExecutor): for what needs no process."""
    return CNIRuntime(
        [str(tmp_path / "bin")], cache_dir=str(tmp_path / "cache"), executor=FakeExecutor(plugins)
    )


def printed(stdout: bytes, stderr: bytes = b"") -> PluginOutput:
    out = PluginOutput(stdout)
    out.stderr = stderr
    return out


@pytest.mark.parametrize(
    "stdout,message",
    [
        (printed(b""), "printed no result"),
        (printed(b"  \n"), "printed no result"),
        (printed(b"hello, world", b"some detail"), "unusable result"),
        (b'{"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.300/24"}]}', "unusable result"),
    ],
)
def test_bad_add_output(tmp_path, make_net, rt, stdout, message):
    runtime = in_process(tmp_path, {"fake-a": {"ADD": stdout}})
    net = make_net(["fake-a"])
    with pytest.raises(PluginExecError, match=message) as err:
        run(runtime.add(net, rt))
    assert err.value.ref.plugin == "fake-a"
    if stdout.startswith(b"hello"):
        assert "hello, world" in str(err.value) and "some detail" in str(err.value)
    assert not cache_file(runtime, "testnet", rt).exists()


def test_error_object_with_exit_0(tmp_path, make_net, rt):
    runtime = in_process(tmp_path, {"fake-a": {"ADD": b'{"code": 7, "msg": "no bridge name"}'}})
    net = make_net(["fake-a"])
    with pytest.raises(CNIError, match="no bridge name") as err:
        run(runtime.add(net, rt))
    assert err.value.code == 7 and not cache_file(runtime, "testnet", rt).exists()
    assert cache_files(runtime) == []  # the write begun while the last plugin ran is undone


def test_failed_add_no_cache(runtime, make_net, call_log, rt):
    net = make_net(
        ["fake-a", {"type": "fake-b", "fake": {"ADD": {"error": {"code": 7, "msg": "bad bridge"}}}}, "fake-c"]
    )
    with pytest.raises(CNIError) as err:
        run(runtime.add(net, rt))
    assert (err.value.code, err.value.ref.network, err.value.ref.plugin) == (7, "testnet", "fake-b")
    assert call_log.summary() == [("ADD", "fake-a"), ("ADD", "fake-b")]
    assert not cache_file(runtime, "testnet", rt).exists() and cache_files(runtime) == []


def test_add_timeout(fake_bin, tmp_path, make_net, rt, monkeypatch, spawned):
    monkeypatch.setenv("HANG_PIDFILE", str(tmp_path / "hang.pid"))  # passed on by name (cni.plugin_env)
    runtime = CNIRuntime(
        [str(fake_bin)],
        cache_dir=str(tmp_path / "cache"),
        exec_timeout=0.3,
        pass_env=["HANG_PIDFILE"],
        executor=PluginExecutor(),
    )
    with pytest.raises(PluginTimeout) as err:  # the plugin never answers, however fast it runs
        run(runtime.add(make_net(["hang"]), rt))
    assert err.value.ref.network == "testnet"
    [pid] = spawned  # known from the spawn: the plugin may be killed before it writes a line
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the plugin itself is gone and reaped
    assert cache_files(runtime) == []


def test_cache_file_made_while_last_plugin_runs(tmp_path, make_net, rt):
    """The entry's temporary file exists while the last plugin works; after ADD only the
    entry is left, with the same bytes a one-step write gives."""
    during: list[str] = []

    def lister(call):
        during.extend(os.listdir(runtime.cache.results_dir))  # what the cache dir holds meanwhile
        return b'{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24"}]}'

    runtime = in_process(tmp_path, {"first": {"ADD": b'{"cniVersion":"1.1.0"}'}, "lister": {"ADD": lister}})
    os.makedirs(runtime.cache.results_dir)
    net = make_net(["first", "lister"])
    result = run(runtime.add(net, rt))
    assert runtime.executor.commands() == ["ADD", "ADD"]
    assert len(during) == 1 and during[0].startswith(".") and during[0].endswith(".tmp")
    assert cache_files(runtime) == [os.path.basename(cache_file(runtime, "testnet", rt))]
    entry = runtime.cache.read("testnet", rt.container_id, rt.ifname)
    assert entry.result == result.to_dict("1.1.0")
    assert cache_file(runtime, "testnet", rt).read_bytes() == entry.to_json()


def test_finalize_chain(runtime, make_net, call_log, rt):
    add_net = make_net(
        ["fake-a"],
        finalize_plugins=[
            {
                "type": "fake-b",
                "fake": {
                    "FINALIZE": {
                        "result": {
                            "cniVersion": "1.1.0",
                            "interfaces": [{"name": "eth0", "metadata": {"finalized-by": "fake-b"}}],
                            "ips": [{"address": "10.249.0.2/24"}],
                        }
                    }
                },
            },
            {"type": "fake-c"},  # prints nothing: the result is unchanged
        ],
    )
    added = run(runtime.add(add_net, rt))
    call_log.clear()
    extra = parse_conflist(
        {
            "name": "x",
            "cniVersion": "1.1.0",
            "plugins": [
                {
                    "type": "fake-d",
                    "log": str(call_log.path),
                    "capabilities": {"portMappings": True},
                    "fake": {
                        "FINALIZE": {"result": {"cniVersion": "1.0.0", "ips": [{"address": "10.249.0.3/24"}]}}
                    },
                }
            ],
        }
    ).plugins
    final = run(runtime.finalize(add_net, rt, added, extra))
    calls = call_log.calls()
    assert call_log.summary() == [("FINALIZE", "fake-b"), ("FINALIZE", "fake-c"), ("FINALIZE", "fake-d")]
    assert calls[0]["stdin"]["prevResult"] == added.to_dict()
    after_b = calls[1]["stdin"]["prevResult"]
    assert after_b["interfaces"][0]["metadata"] == {"finalized-by": "fake-b"}
    assert calls[2]["stdin"]["prevResult"] == after_b
    assert calls[2]["stdin"]["runtimeConfig"] == {"portMappings": rt.capability_args["portMappings"]}
    assert all(
        c["env"]["CNI_COMMAND"] == "FINALIZE" and c["env"]["CNI_CONTAINERID"] == "c0ffee" for c in calls
    )
    assert [ip.address for ip in final.ips] == ["10.249.0.3/24"]
    # the cache now holds what FINALIZE made, for the DEL to see
    assert parse_result(runtime.cache.read("testnet", "c0ffee", "eth0").result).ips == final.ips


def test_finalize_without_plugins_is_a_no_op(runtime, make_net, call_log, rt):
    net = make_net(["fake-a"])
    prev = parse_result({"cniVersion": "1.1.0", "ips": [{"address": "10.249.1.2/24"}]})
    assert run(runtime.finalize(net, rt, prev)) is prev
    assert call_log.calls() == []


class FailingPlugin:
    """Fault injection the daemon's way: a wrapper of the runtime's executor that fails one
    plugin type's exec and passes every other call on."""

    def __init__(self, inner, plugin_type: str) -> None:
        self.inner = inner
        self.plugin_type = plugin_type

    def find(self, plugin_type, bin_dirs):
        return self.inner.find(plugin_type, bin_dirs)

    async def exec(self, plugin_path, env, stdin, timeout):
        if os.path.basename(plugin_path) == self.plugin_type:
            raise RuntimeError("injected fault")
        return await self.inner.exec(plugin_path, env, stdin, timeout)


def test_a_fault_injected_into_the_executor_aborts_the_chain_uncached(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "fake-b"])
    failing = runtime.with_executor(FailingPlugin(runtime.executor, "fake-b"))
    with pytest.raises(RuntimeError, match="injected fault"):
        run(failing.add(net, rt))
    assert call_log.summary() == [("ADD", "fake-a")]
    assert not cache_file(failing, "testnet", rt).exists()
    # control: the same runtime without the wrapper runs both and caches the result
    call_log.clear()
    run(runtime.add(net, rt))
    assert call_log.summary() == [("ADD", "fake-a"), ("ADD", "fake-b")]
    assert cache_file(runtime, "testnet", rt).exists()


def test_cache_write_step_overridable(fake_executor, tmp_path, make_net, rt):
    class NoCache(CNIRuntime):
        async def cache_result(self, net, rt, result, prepared=None):
            self.seen = result

    runtime = NoCache([FAKE_BIN], cache_dir=str(tmp_path / "cache"), executor=fake_executor)
    result = run(runtime.add(make_net(["fake-a"]), rt))
    assert runtime.seen is result and runtime.cache.entries() == []


def test_delete_cached_uses_cached_config(runtime, make_net, call_log, rt):
    net = make_net(["fake-a", "fake-b"])
    result = run(runtime.add(net, rt))
    (entry,) = runtime.cache.entries()
    call_log.clear()
    run(runtime.delete_cached(entry))
    assert call_log.summary() == [("DEL", "fake-b"), ("DEL", "fake-a")]
    assert call_log.calls()[0]["stdin"]["prevResult"] == result.to_dict()
    assert (
        call_log.calls()[0]["env"]["CNI_ARGS"]
        == "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
    )
    assert runtime.cache.entries() == []


def test_version(runtime, tmp_path):
    info = run(runtime.version("fake"))  # what the fake plugin prints
    assert info["cniVersion"] == "1.1.0" and "0.4.0" in info["supportedVersions"]
    answers = in_process(
        tmp_path,
        {
            "oldplugin": {"VERSION": CNIError(4, "unknown CNI_COMMAND: VERSION")},  # (printed, exit 1)
            "v020": {"VERSION": b'{"cniVersion":"0.2.0"}'},
            "junk": {"VERSION": b"hi\n"},
        },
    )
    assert run(answers.version("oldplugin"))["supportedVersions"] == ["0.1.0"]
    assert run(answers.version("v020"))["supportedVersions"] == ["0.1.0", "0.2.0"]
    with pytest.raises(PluginExecError, match="VERSION"):
        run(answers.version("junk"))
    assert answers.executor.commands() == ["VERSION"] * 3


def test_delete_with_unnameable_ids_still_runs(runtime, make_net, call_log, rt):
    """libcni runs DEL even when no cache file can be named after the IDs."""
    bad = dataclasses.replace(rt, container_id="", ifname="eth0")
    run(runtime.delete(make_net(["fake-a"]), bad))
    assert call_log.summary() == [("DEL", "fake-a")]
    assert call_log.calls()[0]["env"]["CNI_CONTAINERID"] == ""


@pytest.mark.parametrize("durable", [False, True])
def test_cache_durability_modes(fake_executor, tmp_path, make_net, rt, durable, monkeypatch):
    from nri_cni.cni import cache as cache_mod

    runtime = CNIRuntime(
        [FAKE_BIN], cache_dir=str(tmp_path / "cache"), durable_cache=durable, executor=fake_executor
    )
    calls = []
    synced = threading.Event()
    commit, sync = cache_mod.PreparedWrite.commit, runtime.cache.sync

    def spy_commit(self, result, *, durable=True):
        calls.append(("write", durable))
        commit(self, result, durable=durable)

    def spy_sync(*key, directory=True):
        calls.append(("sync", key))
        sync(*key, directory=directory)
        synced.set()

    monkeypatch.setattr(cache_mod.PreparedWrite, "commit", spy_commit)
    runtime.cache.sync = spy_sync
    run(runtime.add(make_net(["fake-a"]), rt))
    if durable:
        assert calls == [("write", True)]
    else:
        # written before ADD returned, made durable by the cache's sync thread right after
        assert calls[0] == ("write", False)
        assert synced.wait(5)
        assert calls == [("write", False), ("sync", ("testnet", "c0ffee", "eth0"))]
    assert runtime.cache.read("testnet", "c0ffee", "eth0") is not None


@pytest.mark.parametrize(
    "chain, method",
    [
        # a plugin declaring the `ips` capability gets them as runtimeConfig.ips
        ([{"type": "fake-a", "capabilities": {"ips": True}, "ipam": {"type": "host-local"}}], "capability"),
        # else the plugin whose IPAM reads args.cni.ips (host-local, static) gets them there
        ([{"type": "fake-a", "ipam": {"type": "host-local"}, "args": {"cni": {"mac": "x"}}}], "args"),
        ([{"type": "fake-a", "ipam": {"type": "static"}}], "args"),
        # an IPAM that reads neither: nothing to ask with
        ([{"type": "fake-a", "ipam": {"type": "dhcp"}}], ""),
    ],
)
def test_an_ip_request_reaches_add_alone_never_cni_args_nor_the_cache(
    runtime, make_net, call_log, rt, chain, method
):
    from nri_cni.cni.plugin_io import ip_request_method

    net = make_net([*chain, "fake-b"])
    assert ip_request_method(net) == method
    asked = ("10.77.0.8/24", "fd77:77::4/64")
    run(runtime.add(net, dataclasses.replace(rt, ip_request=asked)))
    first, second = call_log.calls()
    for call in (first, second):  # one address only fits CNI_ARGS IP=: it never carries them
        assert "IP=" not in call["env"]["CNI_ARGS"]
    stdin = first["stdin"]
    if method == "capability":
        assert stdin["runtimeConfig"]["ips"] == list(asked) and "args" not in stdin
    elif method == "args":
        assert stdin["args"]["cni"]["ips"] == list(asked)
        assert stdin["args"]["cni"].get("mac", "x") == "x"  # what the config had stays
    else:
        assert "runtimeConfig" not in stdin and "args" not in stdin
    assert "runtimeConfig" not in second["stdin"] and "args" not in second["stdin"]
    entry = runtime.cache.read("testnet", rt.container_id, rt.ifname)
    assert entry.cni_args == rt.args and "ips" not in entry.capability_args  # the request: ADD's alone
    call_log.clear()
    run(runtime.check(net, rt))
    run(runtime.delete_cached(entry))
    for call in call_log.calls():
        assert "ips" not in json.dumps(call["stdin"].get("runtimeConfig", {}))
        assert "ips" not in json.dumps(call["stdin"].get("args", {}))


def test_del_and_check_drop_a_cached_cni_args_ip(runtime, make_net, call_log, rt):
    """An entry an older nri-cni cached with CNI_ARGS `IP=a,b` (a dual-stack repair): host-local
    parses CNI_ARGS on every verb and fails on the list, so its DEL would fail for ever. DEL
    and CHECK never pass `IP`; ADD passes what it is given."""
    net = make_net(["fake-a"])
    old = dataclasses.replace(rt, args=[*rt.args, ("IP", "10.77.0.8,fd77:77::4")])
    run(runtime.add(net, old))
    assert "IP=10.77.0.8,fd77:77::4" in call_log.calls()[0]["env"]["CNI_ARGS"]
    call_log.clear()
    entry = runtime.cache.read("testnet", rt.container_id, rt.ifname)
    run(runtime.check(net, old))
    run(runtime.delete_cached(entry))
    assert [c["command"] for c in call_log.calls()] == ["CHECK", "DEL"]
    for call in call_log.calls():
        assert "IP=" not in call["env"]["CNI_ARGS"], call["env"]["CNI_ARGS"]


def test_del_and_check_given_the_entry_read_already_take_its_result_and_read_no_file(
    runtime, make_net, call_log, rt
):
    """A pod's DEL and CHECK (and GC) list the pod's entries first: the entry they hold is the
    prevResult, the file is not read again. The file is changed behind the entry's back to
    tell the two apart; the control cases (no entry, or one without a result: an intent's)
    read the file."""
    net = make_net(["fake-a", "fake-b"])
    run(runtime.add(net, rt))
    (held,) = runtime.cache.entries()
    on_disk = dict(held.result, interfaces=[{"name": "changed-on-disk"}])
    runtime.cache.write(dataclasses.replace(held, result=on_disk))

    def prevs() -> list:
        got = [c["stdin"].get("prevResult") for c in call_log.calls()]
        call_log.clear()
        return got

    call_log.clear()
    run(runtime.check(net, rt, entry=held))
    assert prevs() == [held.result] * 2
    run(runtime.check(net, rt))  # control: no entry given
    assert prevs() == [on_disk] * 2
    run(runtime.check(net, rt, entry=dataclasses.replace(held, result=None)))  # control: an intent's
    assert prevs() == [on_disk] * 2
    run(runtime.delete(net, rt, entry=held))
    assert prevs() == [held.result] * 2 and runtime.cache.entries() == []
    run(runtime.add(net, rt))
    runtime.cache.write(dataclasses.replace(held, result=on_disk))
    call_log.clear()
    run(runtime.delete(net, rt))  # control: no entry given
    assert prevs() == [on_disk] * 2 and runtime.cache.entries() == []
