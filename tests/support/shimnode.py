"""The shim-mode e2e node: nri-cni as a process beside a private containerd, with one bridge and
one macvlan network; tests/e2e/conftest.py gives it as the `shim_node` fixture."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.conflists import bridge_conflist, host_local, macvlan_conflist, network, portmap
from tests.support.finalize_probe import install_finalize_probe
from tests.support.janitor import Janitor
from tests.support.leaks import LeakChecker
from tests.support.names import unique_name
from tests.support.nricni import NriCni, ShimSetup


@contextmanager
def shim_node(tmp_path: Path, make_containerd: Callable[..., Any]) -> Iterator[Any]:
    """A node for shim mode: nri-cni beside a private containerd (`node.start()`), a bridge
    network (eth0) and a macvlan one (net1) from `node.networks()`, the FINALIZE probe logging
    to `node.probe_log`; at the end the daemons stop and every trace goes, or the test fails."""
    jan = Janitor()
    setup = ShimSetup(tmp_path)
    daemons: list[NriCni] = []
    node = type("ShimNode", (), {})()
    node.jan, node.setup = jan, setup
    node.bridge = unique_name("br")
    jan.track_link(node.bridge)
    node.master, _ = jan.veth()
    node.probe_log = tmp_path / "finalize.log"
    install_finalize_probe(setup, node.probe_log)

    def networks(*, net1_default=False, eth0_subnet="10.246.40.0/24", net1_subnet="10.246.41.0/24"):
        eth0 = bridge_conflist(
            "podnet", node.bridge, host_local(setup.ipam_dir, eth0_subnet), then=[portmap()]
        )
        net1 = macvlan_conflist(
            "fastnet", node.master, host_local(setup.ipam_dir, net1_subnet), version="1.0.0"
        )
        return [network(eth0), network(net1, default=net1_default, namespaces=["nct-e2e"])]

    def start(nets=None, *, containerd=True, **extra):
        ctd = (
            make_containerd(cni_conf_dir=setup.conf_dir, cni_bin_dirs=[setup.bin_dir]) if containerd else None
        )
        node.ctd = ctd
        cfg = setup.config(ctd.nri_socket if ctd else str(tmp_path / "nri.sock"), nets or networks(), **extra)
        d = NriCni(tmp_path, cfg)
        daemons.append(d)
        node.daemon = d.start(wait_registered=containerd)
        return node.daemon

    node.networks, node.start = networks, start
    node.leaks = LeakChecker(
        dirs=[setup.cache_dir, setup.ipam_dir, setup.state_dir], bridges=[node.bridge]
    ).start()
    yield node
    for d in daemons:
        if d.proc and d.proc.poll() is None:
            d.stop()
    failed = jan.cleanup()
    setup.cleanup()
    if failed:
        pytest.fail(f"cleanup: {failed}")


def run_pod(ctd: Any, name: str, annotations: dict[str, str] | None = None) -> Any:
    """A pod sandbox of namespace nct-e2e (the one the macvlan network is limited to)."""
    return ctd.cri.run_pod(name, "nct-e2e", str(uuid.uuid4()), annotations=annotations or {})
