"""What the CRI-O tests share (no tests in here): the containerd tests' node (RecoveryNode:
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

from tests.e2e.test_recovery_node import RecoveryNode
from tests.support.crio import Crio

REPO = Path(__file__).resolve().parents[2]
CRIO_SHIM_CONFLIST = REPO / "config" / "crio" / "net.d" / "10-nri-cni.conflist"


def crio_node(tmp_path: Path, make_crio, make_bridge_network) -> RecoveryNode:
    def make(*, cni_conf_dir: Path, **kw) -> Crio:
        names = {json.loads(p.read_text())["name"] for p in Path(cni_conf_dir).glob("*.conflist")}
        if "nri-cni" not in names:  # secondary mode: the primary's list is CRI-O's network
            (kw["default_network"],) = names
        return make_crio(cni_conf_dir=cni_conf_dir, **kw)

    node = RecoveryNode(tmp_path, make, make_bridge_network)
    shim_list = json.loads(CRIO_SHIM_CONFLIST.read_text())
    for plugin in shim_list["plugins"]:
        if plugin["type"] == "nri-cni-shim":
            plugin["daemonSocket"] = node.setup.socket
    for old in node.setup.conf_dir.glob("*.conflist"):
        old.unlink()
    (node.setup.conf_dir / CRIO_SHIM_CONFLIST.name).write_text(json.dumps(shim_list))
    return node


def crio_leaks(crio: Crio, pods) -> list[str]:
    """What CRI-O keeps of removed pods outside nri-cni's dirs: libcni cache entries, and the
    netns pins of the pods the test saw (CRI-O's orphans of a cut creation are its own leak)."""
    out = [f"CRI-O's libcni cache entry {p}" for pod in pods for p in crio.cni_cache_entries(pod)]
    return out + [f"netns pin {p}" for p in crio.netns_pins() if p in crio.known_netns]
