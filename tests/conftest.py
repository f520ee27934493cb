"""Session-wide hygiene for every test that runs real CNI plugins.

The plugins leave host-wide state that no DEL removes: portmap's and firewall's shared chains
(CNI-HOSTPORT-*, CNI-FORWARD, CNI-ADMIN, and the jumps into them), and the bridge plugin turns
on net.ipv4.ip_forward. At the end of the session, remove the chains this session brought (only
while nothing else uses them) and put ip_forward back as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.netns import iptables_lines, pod_chains, remove_chains, remove_cni_scaffolding

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


@pytest.fixture(scope="session", autouse=True)
def host_state_restored():
    baseline = set(iptables_lines())
    forward = IP_FORWARD.read_text().strip()
    yield
    remove_cni_scaffolding(baseline)
    if IP_FORWARD.read_text().strip() != forward:
        IP_FORWARD.write_text(forward + "\n")


# the tests that run real plugins through pods: no pod of theirs may keep iptables chains
_REAL_PLUGIN_DIRS = {"e2e", "cni_real", "pod"}


@pytest.fixture(autouse=True)
def no_pod_chain_left(request):
    """After each test that runs real plugins: no per-pod iptables chain (portmap's CNI-DN-,
    bridge's CNI-<hash>) it made may remain. What remains is removed, and the test fails."""
    if not _REAL_PLUGIN_DIRS & set(Path(str(request.node.path)).parts):
        yield
        return
    before = pod_chains()
    yield
    left = pod_chains() - before
    if left:
        rules = remove_chains(left)
        pytest.fail(
            "per-pod iptables chains left behind (removed now):\n  "
            + "\n  ".join(sorted(" ".join(c) for c in left) + rules),
            pytrace=False,
        )
