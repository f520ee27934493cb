"""Harness for the pod-networking tests: a real daemon, the NRI test double, real plugins.

`node` gives a Janitor (everything it makes is removed), a CNI bin dir holding the real plugins
from Debian sid plus the scriptable fake plugin (tests/plugins/fake_plugin.py) under a few names,
and a DaemonHarness that runs `Daemon` in-process against the runtime-side NRI double.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import pytest

from nri_cni.api import nri_pb2
from nri_cni.config import parse_config
from nri_cni.daemon.app import Daemon, build_daemon
from tests.support.bin_dir import install_test_plugin, link_real_plugins
from tests.support.conflists import bridge_conflist, host_local, macvlan_conflist, portmap
from tests.support.daemon_config import daemon_config
from tests.support.hostlocal import host_local_reservations
from tests.support.janitor import Janitor
from tests.support.jsonlines import read_json_lines
from tests.support.leaks import LeakChecker
from tests.support.names import unique_name
from tests.support.nri_runtime import CONTAINERD, NriRuntime, RuntimeKind

FAKE_NAMES = ("fake-finalize", "fake-finalize2", "fake-fail", "fake-ok")


def install_bin_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    link_real_plugins(path)
    install_test_plugin(path, "fake_plugin", *FAKE_NAMES)
    return path


def pod_message(
    pod_id: str, netns: str, *, name: str = "", namespace: str = "default", annotations: dict | None = None
) -> nri_pb2.PodSandbox:
    pod = nri_pb2.PodSandbox(
        id=pod_id,
        name=name or f"pod-{pod_id[:6]}",
        namespace=namespace,
        uid=str(uuid.uuid4()),
        annotations=annotations or {},
    )
    if netns:
        pod.linux.namespaces.add(type="network", path=netns)
    return pod


def new_pod_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex[:32]


class Node:
    """One test's private world: dirs, bin dir, janitor, subnets, names."""

    def __init__(self, tmp_path: Path, jan: Janitor) -> None:
        self.tmp = tmp_path
        self.jan = jan
        self.bin_dir = install_bin_dir(tmp_path / "bin")
        self.cache_dir = tmp_path / "cache"
        self.state_dir = tmp_path / "state"
        self.ipam_dir = tmp_path / "ipam"
        self.log = tmp_path / "fake.log"
        self.finalize_dir = tmp_path / "net.d" / "_finalize.d"
        self.finalize_dir.mkdir(parents=True)

    def bridge_net(self, name: str, subnet: str, *, bridge: str | None = None, **extra) -> dict:
        bridge = bridge or unique_name("br")
        self.jan.track_link(bridge)
        return {**bridge_conflist(name, bridge, host_local(self.ipam_dir, subnet), then=[portmap()]), **extra}

    def macvlan_net(self, name: str, subnet: str, master: str) -> dict:
        return macvlan_conflist(name, master, host_local(self.ipam_dir, subnet))

    def fake(self, name: str = "fake-finalize", **behaviour) -> dict:
        """A fake plugin config logging to self.log; behaviour as in fake_plugin.py ("fake")."""
        conf = {"type": name, "log": str(self.log)}
        if behaviour:
            conf["fake"] = behaviour
        return conf

    def calls(self) -> list[dict]:
        return read_json_lines(self.log)

    def config(self, mode: str, networks: list[dict], **extra) -> dict:
        extra.setdefault("gc", {"interval": 0})
        extra.setdefault("status", {"interval": 0})
        return daemon_config(
            mode,
            networks,
            nri_socket=self.tmp / "nri.sock",
            daemon_socket=self.tmp / "daemon.sock",
            state_dir=self.state_dir,
            bin_dirs=[self.bin_dir],
            cache_dir=self.cache_dir,
            finalize_dir=self.finalize_dir,
            plugin_timeout="20s",
            **extra,
        )

    def leak_checker(self, *netns) -> LeakChecker:
        return LeakChecker(
            dirs=[self.cache_dir, self.ipam_dir, self.state_dir / "intents"], netns=list(netns)
        )

    def reservations(self):
        return host_local_reservations(self.ipam_dir) if self.ipam_dir.exists() else []


class DaemonHarness:
    """`nri-cni run` in-process, connected to the runtime-side NRI double."""

    def __init__(
        self,
        node: Node,
        cfg: dict,
        *,
        kind: RuntimeKind | None = None,
        runtime_name: str | None = None,
        runtime_version: str | None = None,
        pods=(),
        request_timeout_ms: int = 20000,
    ) -> None:
        """Without `kind`, the double acts as containerd but names itself "nri-test-double"
        1.0.0 (a runtime the failure policy knows nothing of); with it, as that runtime."""
        self.node = node
        self.cfg = parse_config(cfg, str(node.tmp / "config.yaml"))
        if kind is None:
            runtime_name = runtime_name or "nri-test-double"
            runtime_version = runtime_version or "1.0.0"
        self.runtime = NriRuntime(
            self.cfg.nri.socket,
            kind=kind or CONTAINERD,
            runtime_name=runtime_name,
            runtime_version=runtime_version,
            request_timeout_ms=request_timeout_ms,
            pods=pods,
        )
        self.daemon: Daemon | None = None
        self.task: asyncio.Task | None = None

    async def start(self) -> DaemonHarness:
        await self.runtime.start()
        self.daemon = build_daemon(self.cfg)
        self.task = asyncio.create_task(self.daemon.run(handle_signals=False))
        await self.runtime.wait_plugin()
        await asyncio.wait_for(self.daemon.stub.synchronized.wait(), 60)
        await self.settle()
        return self

    async def settle(self) -> None:
        """Wait for the background work started by Synchronize (GC, repair); the deadline
        only fails a hang."""
        deadline = time.monotonic() + 60
        while self.daemon.pods.timers.background():
            if time.monotonic() > deadline:
                raise AssertionError("background work after Synchronize did not finish")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            await asyncio.wait_for(self.task, 60)
        await self.runtime.stop()

    async def __aenter__(self) -> DaemonHarness:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


@pytest.fixture
def node(tmp_path):
    jan = Janitor()
    n = Node(tmp_path, jan)
    yield n
    jan.cleanup_or_raise()


@pytest.fixture(autouse=True)
def _quiet_loggers():
    logging.getLogger("nri_cni").setLevel(logging.INFO)
    yield


def run(coro):
    return asyncio.run(coro)
