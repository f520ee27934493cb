"""Shared pieces of the security tests: a shim-mode daemon in-process with the fake
plugin, and the shim exec'd exactly as a runtime execs a CNI plugin (only CNI_* variables and
PATH in its environment, the network config on stdin), in both builds."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from nri_cni.shim import install
from tests.support.harness import DaemonHarness, Node

BUILDS = pytest.mark.parametrize("compiled", [True, False], ids=["c", "script"])
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# a YAML alias bomb: 9**9 strings once its aliases are expanded
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


def fake_net(node: Node, name: str = "podnet", *, default: bool = True, **extra) -> dict:
    return {
        "name": name,
        "default": default,
        **extra,
        "conflist": {"cniVersion": "1.1.0", "name": name, "plugins": [node.fake("fake-ok")]},
    }


def shim_config(node: Node, **extra) -> dict:
    return node.config("shim", [fake_net(node)], **extra)


def install_shim(node: Node, compiled: bool, default_socket: str | None = None) -> str:
    return install(
        str(node.tmp / ("shim-c" if compiled else "shim-py")),
        default_socket or str(node.tmp / "daemon.sock"),
        compiled=compiled,
    )


def runtime_conf(annotations: dict | None = None, **top) -> dict:
    conf = {"cniVersion": "1.0.0", "name": "nri-cni", "type": "nri-cni-shim", **top}
    if annotations is not None:
        conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": annotations}
    return conf


async def call_shim(
    shim: str, command: str, cid: str, *, conf: dict | bytes | None = None, netns: str = "", **env
) -> tuple[int, dict | None, bytes]:
    """One CNI call as containerd makes it; returns (exit status, parsed stdout or None, raw)."""
    full = {
        "PATH": PATH,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
        **env,
    }
    body = conf if isinstance(conf, bytes) else json.dumps(conf or runtime_conf()).encode()
    proc = await asyncio.create_subprocess_exec(
        shim,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full,
    )
    out, _ = await asyncio.wait_for(proc.communicate(body), 60)
    try:
        parsed = json.loads(out) if out.strip() else None
    except ValueError:
        parsed = None
    return proc.returncode, parsed, out


def all_files(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


async def normal_add_del(shim: str, node: Node, cid: str) -> None:
    """The daemon still does its job: an ordinary ADD then DEL succeed and leave nothing."""
    netns = netns_path(node)
    code, out, raw = await call_shim(shim, "ADD", cid, netns=netns)
    assert code == 0, raw
    assert out and out.get("cniVersion") == "1.0.0", raw
    code, _, raw = await call_shim(shim, "DEL", cid, netns=netns)
    assert code == 0, raw
    assert not list((node.state_dir / "intents").glob("*")) if (node.state_dir / "intents").exists() else True


async def started(node: Node, cfg: dict) -> DaemonHarness:
    return await DaemonHarness(node, cfg).start()


def pod_calls(node: Node) -> list[dict]:
    """The plugin calls made for pods (the daemon's own STATUS, VERSION and GC calls left out)."""
    return [c for c in node.calls() if c["command"] not in ("STATUS", "VERSION", "GC")]


def netns_path(node: Node) -> str:
    """A real network namespace for the test's pods (the janitor removes it)."""
    if not hasattr(node, "_sec_netns"):
        node._sec_netns = node.jan.netns().path
    return node._sec_netns
