"""The blocking test plugin (block_plugin.py): it blocks where it is told to, tells who it is, lets
itself be killed, and goes on (or fails) when released. No root needed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.errors import CNIError
from tests.plugins.block_plugin import BlockControl
from tests.support.bin_dir import install_test_plugin

PREV = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": "10.247.0.2/24"}]}


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "bin").mkdir()
    install_test_plugin(tmp_path / "bin", "block_plugin", "block")
    return tmp_path / "bin" / "block"


@pytest.fixture
def ctl(tmp_path) -> BlockControl:
    return BlockControl(tmp_path / "block")


def start(plugin, command: str, conf: dict, cid: str = "c1") -> subprocess.Popen:
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_IFNAME="eth0", CNI_NETNS="/x")
    p = subprocess.Popen([str(plugin)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert p.stdin is not None
    p.stdin.write(json.dumps(conf).encode())
    p.stdin.close()
    return p


def finish(p: subprocess.Popen) -> bytes:
    assert p.stdout is not None
    out = p.stdout.read()  # until the plugin exits
    p.wait(timeout=30)
    return out


def conf(ctl: BlockControl, **block) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": "n",
        "type": "block",
        "block": ctl.config(**block),
        "prevResult": PREV,
    }


def test_blocks_until_released_then_passes_its_prev_result(plugin, ctl):
    p = start(plugin, "ADD", conf(ctl))
    b = ctl.wait_blocked("ADD", "c1")
    assert (b.pid, b.ppid, b.container_id, b.ifname) == (p.pid, os.getpid(), "c1", "eth0")
    assert b.alive() and p.poll() is None and not ctl.done(b)
    ctl.release(b)
    out = finish(p)
    assert p.returncode == 0 and json.loads(out) == PREV and ctl.done(b)


def test_killed_by_pid_while_blocked(plugin, ctl):
    p = start(plugin, "DEL", conf(ctl))
    b = ctl.wait_blocked("DEL")
    os.kill(b.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert not b.alive() and not ctl.done(b)


def test_released_to_fail(plugin, ctl):
    p = start(plugin, "GC", conf(ctl, then="fail"), cid="")
    b = ctl.wait_blocked("GC")
    assert b.container_id == ""
    ctl.release_all()
    out = finish(p)
    err = json.loads(out)
    assert p.returncode == 1 and err["code"] == 11 and "released to fail" in err["msg"]


def test_gives_up_when_never_released(plugin, ctl):
    p = start(plugin, "ADD", conf(ctl, timeout=0.1))
    out = finish(p)
    assert p.returncode == 1 and "never released" in json.loads(out)["msg"]


def test_only_the_listed_commands_block(plugin, ctl):
    p = start(plugin, "CHECK", conf(ctl, commands=["ADD"]))
    out = finish(p)
    assert p.returncode == 0 and out == b"" and ctl.blocked() == []
    p = start(plugin, "VERSION", conf(ctl))
    out = finish(p)
    assert p.returncode == 0 and "1.1.0" in json.loads(out)["supportedVersions"]


def test_two_pods_block_and_are_released_one_by_one(plugin, ctl):
    p1, p2 = start(plugin, "ADD", conf(ctl), "c1"), start(plugin, "ADD", conf(ctl), "c2")
    b1, b2 = ctl.wait_blocked("ADD", "c1"), ctl.wait_blocked("ADD", "c2")
    ctl.release(b2)
    assert p2.wait(timeout=30) == 0
    assert p1.poll() is None and b1.alive()
    ctl.release(b1)
    assert p1.wait(timeout=30) == 0


def test_through_the_cni_runtime_killed_then_released(tmp_path, plugin, ctl):
    """nri-cni's own exec runs it: the ADD waits on it, a kill fails the ADD, a release ends it."""
    net = parse_conflist(
        json.dumps(
            {"cniVersion": "1.1.0", "name": "blocknet", "plugins": [{"type": "block", "block": ctl.config()}]}
        ).encode(),
        source="test",
    )
    rt = CNIRuntime([str(plugin.parent)], cache_dir=str(tmp_path / "cache"), executor=PluginExecutor())

    async def scenario():
        conf1 = RuntimeConf(container_id="pod-a", netns="/var/run/netns/none", ifname="eth0")
        add = asyncio.create_task(rt.add(net, conf1))
        b = await asyncio.to_thread(ctl.wait_blocked, "ADD", "pod-a")
        assert b.ppid == os.getpid() and not add.done()
        os.kill(b.pid, signal.SIGKILL)
        with pytest.raises(CNIError):
            await add
        conf2 = RuntimeConf(container_id="pod-b", netns="/var/run/netns/none", ifname="eth0")
        add = asyncio.create_task(rt.add(net, conf2))
        b = await asyncio.to_thread(ctl.wait_blocked, "ADD", "pod-b")
        ctl.release(b)
        return await add

    result = asyncio.run(scenario())
    assert result.cni_version == "1.1.0"


def test_an_armed_plugin_blocks_only_while_armed(plugin, ctl):
    c = conf(ctl, armed=True)
    p = start(plugin, "ADD", c)
    assert finish(p) and p.returncode == 0 and ctl.blocked() == []  # not armed: passes at once
    ctl.arm()
    p = start(plugin, "ADD", c)
    b = ctl.wait_blocked("ADD")
    ctl.disarm()  # a blocked call stays blocked until released
    assert p.poll() is None and b.alive()
    ctl.release(b)
    assert p.wait(timeout=30) == 0


def test_the_same_call_again_blocks_again(plugin, ctl):
    p = start(plugin, "DEL", conf(ctl))
    first = ctl.wait_blocked("DEL", "c1")
    ctl.release(first)
    assert p.wait(timeout=30) == 0 and ctl.done(first)
    p = start(plugin, "DEL", conf(ctl))  # a retried DEL of the same pod
    again = ctl.wait_blocked("DEL", "c1")
    assert again.pid == p.pid and not ctl.released(again)
    ctl.release(again)
    assert p.wait(timeout=30) == 0
