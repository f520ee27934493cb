"""What the CRI-O tests share (no tests in here), and the tests written once for both runtimes
(``runtime_node``: containerd, and CRI-O where it is installed): the containerd tests' node (RecoveryNode:
nri-cni's dirs, bridge and macvlan networks, daemon, fault helpers) with a private CRI-O in
containerd's place. The CRI-O instance has the interface the node uses (``cri``,
``nri_socket``, ``start``, ``stop``, ``kill9``), so the node's code runs unchanged.

Shim mode: CRI-O's network dir holds config/crio/net.d/10-nri-cni.conflist (only its daemon
socket pointed at the test's daemon), and the shipped drop-in's ``cni_default_network`` picks
it. Secondary mode: the drop-in's key is overridden with the primary's name, as
docs/deploy.md tells an admin to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.containerd import CNI_RESULTS_DIR
from tests.support.crio import Crio, install_shim_conflist
from tests.support.finalize_probe import install_finalize_probe
from tests.support.recovery_node import RecoveryNode

# the runtimes a test written once runs on (its CRI-O cases fail without CRI-O, unless
# NRI_CNI_NO_CRIO=1 leaves them out: tests/e2e/conftest.py)
RUNTIMES = ("containerd", "crio")


def crio_node(tmp_path: Path, make_crio, make_bridge_network) -> RecoveryNode:
    def make(*, cni_conf_dir: Path, **kw) -> Crio:
        names = {json.loads(p.read_text())["name"] for p in Path(cni_conf_dir).glob("*.conflist")}
        if "nri-cni" not in names:  # secondary mode: the primary's list is CRI-O's network
            (kw["default_network"],) = names
        return make_crio(cni_conf_dir=cni_conf_dir, **kw)

    node = RecoveryNode(tmp_path, make, make_bridge_network)
    install_shim_conflist(node.setup.conf_dir, node.setup.socket)
    return node


def start_secondary(node: RecoveryNode, net1: dict, **extra):
    """CRI-O with its own bridge network and nri-cni in secondary mode adding `net1`; returns
    (daemon, crio, a started leak checker that watches CRI-O's network too)."""
    daemon = node.start_secondary(net1, **extra)
    checker = node.leak_checker()
    checker.dirs.append(str(node.primary.ipam_dir))
    checker.bridges.add(node.primary.bridge)
    return daemon, node.ctd, checker.start()


def runtime_leaks(runtime, pods) -> list[str]:
    """What the runtime keeps of removed pods outside nri-cni's dirs: libcni cache entries, and
    CRI-O's netns pins of the pods the test saw (its orphans of a cut creation are its own leak)."""
    out = [
        f"the runtime's libcni cache entry {p}" for pod in pods for p in CNI_RESULTS_DIR.glob(f"*-{pod}-*")
    ]
    if isinstance(runtime, Crio):
        out += [f"netns pin {p}" for p in runtime.netns_pins() if p in runtime.known_netns]
    return out


def _probed(node: RecoveryNode, tmp_path: Path):
    """The node with a FINALIZE drop-in probe that logs "VERB pod ifname links," a call to
    ``node.probe_log``; torn down in reverse: pods through the daemon, the runtime, networks."""
    node.probe_log = tmp_path / "probe.log"
    install_finalize_probe(node.setup, node.probe_log)
    yield node
    failed = node.cleanup()
    if failed:
        pytest.fail(f"cleanup: {failed}")


@pytest.fixture(params=RUNTIMES)
def runtime_node(request, tmp_path, make_bridge_network, make_containerd, make_crio):
    """The node on containerd, or on CRI-O (``node.runtime_name`` says which)."""
    if request.param == "crio":
        node = crio_node(tmp_path, make_crio, make_bridge_network)
    else:
        node = RecoveryNode(tmp_path, make_containerd, make_bridge_network)
    node.runtime_name = request.param
    yield from _probed(node, tmp_path)


@pytest.fixture
def crio_rnode(tmp_path, make_bridge_network, make_crio):
    """The node on CRI-O, with the FINALIZE probe."""
    yield from _probed(crio_node(tmp_path, make_crio, make_bridge_network), tmp_path)
