"""A bridge network of real plugins (bridge + host-local from Debian sid) and pods attached to it
through nri_cni.cni.runtime, each in its own netns; everything is removed at teardown, also after
a failure. A missing plugin or privilege FAILS the tests (never skips them)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.node import Expectation, NodeInspector, expectation_from_result
from tests.support.bin_dir import REAL_PLUGINS
from tests.support.conflists import bridge_conflist, host_local
from tests.support.firewall import purge_firewall_rules
from tests.support.janitor import Janitor
from tests.support.names import free_subnet, unique_name
from tests.support.netns import Netns


@dataclass
class Pod:
    cid: str
    ns: Netns
    rt: RuntimeConf
    result: dict

    @property
    def ip(self) -> str:
        return self.result["ips"][0]["address"]

    def host_veth(self, bridge: str) -> str:
        return next(
            i["name"] for i in self.result["interfaces"] if not i.get("sandbox") and i["name"] != bridge
        )


@dataclass
class BridgeNet:
    """One bridge network and the pods attached to it by the real plugins."""

    tmp: Path
    jan: Janitor
    bridge: str = field(default_factory=lambda: unique_name("br"))
    name: str = field(default_factory=lambda: unique_name("net", length=20))
    pods: list[Pod] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.subnet = free_subnet(24)
        self.jan.track_link(self.bridge)  # the bridge plugin makes it; DEL leaves it
        conflist = bridge_conflist(self.name, self.bridge, host_local(self.tmp / "ipam", str(self.subnet)))
        self.net = parse_conflist(json.dumps(conflist).encode(), source="test:node")
        self.runtime = CNIRuntime(
            [str(REAL_PLUGINS)], cache_dir=str(self.tmp / "cache"), executor=PluginExecutor()
        )

    def attach(self, ns: Netns | None = None, *, ifname: str = "eth0") -> Pod:
        ns = ns or self.jan.netns()
        cid = "nct-" + uuid.uuid4().hex
        rt = RuntimeConf(container_id=cid, netns=ns.path, ifname=ifname)
        pod = Pod(cid, ns, rt, {})
        self.pods.append(pod)  # before the ADD: a half-done ADD is DELeted at teardown too
        pod.result = asyncio.run(self.runtime.add(self.net, rt)).to_dict("1.1.0")
        return pod

    def expectation(self, pod: Pod) -> Expectation:
        return expectation_from_result(pod.result, key=pod.cid, netns=pod.ns.path, ifname=pod.rt.ifname)

    def check(self, pod: Pod) -> None:
        """CNI CHECK of the chain with the cached result (raises CNIError on a difference)."""
        asyncio.run(self.runtime.check(self.net, pod.rt))

    def teardown(self) -> list[str]:
        errors = []
        markers = {self.name, self.bridge}
        for pod in self.pods:
            markers.update({pod.cid, *(ip["address"].split("/")[0] for ip in pod.result.get("ips", []))})
            try:
                asyncio.run(self.runtime.delete(self.net, pod.rt))
            except Exception as exc:  # the rest must still go; the janitor removes the links
                errors.append(f"DEL {pod.cid}: {exc!r}")
        purge_firewall_rules(markers)
        return errors


@pytest.fixture(scope="session")
def plugins_present() -> None:
    if os.geteuid() != 0:
        pytest.fail("the node inspector tests need root (netns, veth, bridge)")
    missing = [p for p in ("bridge", "host-local") if not os.access(REAL_PLUGINS / p, os.X_OK)]
    if missing:
        pytest.fail(f"CNI plugins missing in {REAL_PLUGINS}: {missing} (run .ci/install-deps)")


@pytest.fixture
def jan(request, plugins_present) -> Janitor:
    j = Janitor()
    request.addfinalizer(j.cleanup_or_raise)
    return j


@pytest.fixture
def bridge_net(tmp_path, jan, request) -> BridgeNet:
    net = BridgeNet(tmp_path, jan)

    def teardown() -> None:  # runs before the janitor's cleanup (finalizers run last-in first-out)
        errors = net.teardown()
        if errors:
            raise AssertionError("teardown: " + "; ".join(errors))

    request.addfinalizer(teardown)
    return net


@pytest.fixture
def second_net(tmp_path, jan, request) -> BridgeNet:
    """Another bridge network, for pods with two interfaces."""
    (tmp_path / "second").mkdir()
    net = BridgeNet(tmp_path / "second", jan)

    def teardown() -> None:
        errors = net.teardown()
        if errors:
            raise AssertionError("teardown: " + "; ".join(errors))

    request.addfinalizer(teardown)
    return net


@pytest.fixture
def inspector():
    ins = NodeInspector.with_workers(2)
    yield ins
    ins.close()
