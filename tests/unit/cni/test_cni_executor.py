"""The plugin-exec seam (nri_cni/cni/executor.py): the in-process FakeExecutor answers as a
plugin would, and the CNI runtime runs a chain through it without a process."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.executor import ALL_VERSIONS, FakeExecutor
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.errors import CNIError, PluginNotRun


def run(coro):
    return asyncio.run(coro)


def test_the_fake_answers_per_plugin_and_command_and_records_every_call():
    fake = FakeExecutor(
        {
            "canned": b'{"cniVersion":"1.1.0"}',
            "per-command": {"ADD": b"added", "DEL": CNIError(11, "later")},
            "computed": lambda call: call.command.encode() + call.stdin,
        }
    )
    path = fake.find("canned", ["/opt/cni/bin"])
    assert run(fake.exec(path, {"CNI_COMMAND": "ADD"}, b"{}", 10)) == b'{"cniVersion":"1.1.0"}'
    per = fake.find("per-command", [])
    assert run(fake.exec(per, {"CNI_COMMAND": "ADD"}, b"", 10)) == b"added"
    with pytest.raises(CNIError, match="later"):
        run(fake.exec(per, {"CNI_COMMAND": "DEL"}, b"", 10))
    assert run(fake.exec(per, {"CNI_COMMAND": "CHECK"}, b"", 10)) == b""  # not in its table
    assert run(fake.exec(per, {"CNI_COMMAND": "VERSION"}, b"", 10)) == ALL_VERSIONS
    assert run(fake.exec(fake.find("computed", []), {"CNI_COMMAND": "GC"}, b"{}", 10)) == b"GC{}"
    assert [(c.plugin, c.command) for c in fake.calls] == [
        ("canned", "ADD"),
        ("per-command", "ADD"),
        ("per-command", "DEL"),
        ("per-command", "CHECK"),
        ("per-command", "VERSION"),
        ("computed", "GC"),
    ]
    with pytest.raises(PluginNotRun, match="'missing'"):
        fake.find("missing", ["/opt/cni/bin"])


def test_a_chain_runs_through_the_fake_in_order(tmp_path):
    def second(call):
        assert call.config()["prevResult"]["interfaces"] == [{"name": "eth0"}]  # the first's result
        return b'{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.1.2.3/24"}]}'

    fake = FakeExecutor(
        {
            "first": {"ADD": b'{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}]}'},
            "second": {"ADD": second},
        }
    )
    runtime = CNIRuntime([str(tmp_path / "bin")], cache_dir=str(tmp_path / "cache"), executor=fake)
    net = parse_conflist(
        {"name": "net", "cniVersion": "1.1.0", "plugins": [{"type": "first"}, {"type": "second"}]}, "inline"
    )
    rt = RuntimeConf(container_id="c0ffee", netns="/var/run/netns/x", ifname="eth0")
    result = run(runtime.add(net, rt))
    assert [str(ip.address) for ip in result.ips] == ["10.1.2.3/24"]
    run(runtime.delete(net, rt))
    assert [(c.plugin, c.command) for c in fake.calls] == [
        ("first", "ADD"),
        ("second", "ADD"),
        ("second", "DEL"),
        ("first", "DEL"),
    ]
    assert all(c.env["CNI_CONTAINERID"] == "c0ffee" for c in fake.calls)
