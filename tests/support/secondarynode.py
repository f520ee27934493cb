"""The secondary-mode e2e node: containerd's own CNI makes eth0 (a bridge list in its conf dir),
nri-cni in secondary mode adds net1 (macvlan over a veth master); tests/e2e/conftest.py gives
the `make_secondary_node` fixture."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.conflists import host_local, macvlan_conflist, network
from tests.support.finalize_probe import install_finalize_probe, probe_calls
from tests.support.janitor import Janitor
from tests.support.leaks import LeakChecker
from tests.support.names import unique_name
from tests.support.nricni import NriCni, ShimSetup

NAMESPACE = "nct-e2e"
# Generous: the 2 s default is fine for these few plugins, but the machine is shared and noisy
# and a timed-out request would make containerd run the pod without nri-cni (another test).
NRI_TIMEOUT = "15s"


class SecondaryNode:
    """containerd with its own bridge network + nri-cni in secondary mode adding `fastnet`."""

    def __init__(self, tmp: Path, make_bridge_network, make_containerd, subnets: tuple[str, str]):
        self.tmp = tmp
        self.make_containerd = make_containerd
        self.jan = Janitor()
        self.setup = ShimSetup(tmp)  # nri-cni's bin dir (real + fake plugins), state, cache, socket
        self.primary = make_bridge_network(
            bridge=unique_name("cb"), subnet=subnets[0], name=f"cbr0-{secrets.token_hex(3)}"
        )
        self.net1_subnet = subnets[1]
        self.master, _ = self.jan.veth()
        self.probe_log = tmp / "finalize.log"
        install_finalize_probe(self.setup, self.probe_log)
        self.ctd = None
        self.daemon: NriCni | None = None
        self.leaks = LeakChecker(
            dirs=[self.setup.cache_dir, self.setup.ipam_dir, self.setup.state_dir, self.primary.ipam_dir],
            bridges=[self.primary.bridge],
        ).start()

    def fastnet(self, *, master: str | None = None, finalize_plugins: list | None = None) -> dict:
        ipam = host_local(self.setup.ipam_dir, self.net1_subnet)
        conflist = macvlan_conflist("fastnet", master or self.master, ipam, version="1.0.0")
        if finalize_plugins:
            conflist["finalize_plugins"] = finalize_plugins
        return network(conflist)

    def start(self, net: dict | None = None, **extra) -> NriCni:
        self.ctd = self.make_containerd(cni_conf_dir=self.primary.conf_dir, nri_request_timeout=NRI_TIMEOUT)
        cfg = self.setup.config(
            self.ctd.nri_socket,
            [net or self.fastnet()],
            mode="secondary",
            primary_network=self.primary.name,
            **extra,
        )
        cfg["cni"]["runtime_cache_dir"] = "/var/lib/cni"  # containerd's; it cannot be moved
        self.daemon = NriCni(self.tmp, cfg).start()
        return self.daemon

    def run_pod(self, prefix: str, networks: list[str] | None = None) -> str:
        """A pod of NAMESPACE named `prefix`-<random>; `networks`: the ones it asks for by name."""
        annotations = {"k8s.v1.cni.cncf.io/networks": ",".join(networks)} if networks else None
        return self.ctd.cri.run_pod(
            f"{prefix}-{uuid.uuid4().hex[:8]}", NAMESPACE, str(uuid.uuid4()), annotations=annotations
        )

    def remove_pod(self, pod: str) -> None:
        self.ctd.cri.stop_pod(pod)
        self.ctd.cri.remove_pod(pod)

    def probe_calls(self, pod: str) -> list[tuple[str, str, str]]:
        """(verb, CNI_IFNAME, links) of every probe call for `pod`, in order."""
        return probe_calls(self.probe_log, pod)

    def failed_pod_id(self) -> str:
        """The id of the pod whose ADD nri-cni logged as failed (RunPodSandbox gave none)."""
        ids = {op["podId"] for op in self.daemon.op_lines() if op["op"] == "add" and op["result"] == "error"}
        assert len(ids) == 1, self.daemon.op_lines()
        return ids.pop()

    def teardown(self) -> list[str]:
        problems = []
        # Pods left by a failed test go while nri-cni still runs, so that it DELs net1 too.
        if self.ctd is not None and self.ctd.running:
            try:
                for pod in self.ctd.cri.list_pods():
                    self.ctd.cri.stop_pod(pod.id)
                    self.ctd.cri.remove_pod(pod.id)
            except Exception as exc:
                problems.append(f"removing pods: {exc}")
        if self.daemon is not None:
            self.daemon.stop()
        problems += self.jan.cleanup()
        self.setup.cleanup()
        return problems


@contextmanager
def secondary_nodes(
    tmp_path: Path, make_bridge_network: Callable[..., Any], make_containerd: Callable[..., Any]
) -> Iterator[Callable[[tuple[str, str]], SecondaryNode]]:
    """A factory of secondary nodes (subnets: containerd's, net1's); each is torn down at the end,
    or the test fails."""
    nodes: list[SecondaryNode] = []

    def factory(subnets: tuple[str, str]) -> SecondaryNode:
        node = SecondaryNode(tmp_path, make_bridge_network, make_containerd, subnets)
        nodes.append(node)
        return node

    yield factory
    problems = [p for node in nodes for p in node.teardown()]
    if problems:
        pytest.fail(f"cleanup: {problems}")
