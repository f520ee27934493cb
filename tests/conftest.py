"""Which tests are integration tests, and the host hygiene that only those need.

`integration` marks every test that needs root or the machine: network namespaces, real CNI
plugins, iptables, containerd. It is given here by directory (INTEGRATION_DIRS) and to every
test marked `e2e` or `netns`; a unit test elsewhere that needs root is marked by hand.
`pytest -m "not integration"` is the unit subset, which runs as any user (.ci/run runs it as
nobody).

The real plugins leave host-wide state that no DEL removes: portmap's and firewall's shared
chains (CNI-HOSTPORT-*, CNI-FORWARD, CNI-ADMIN, and the jumps into them), and the bridge
plugin turns on net.ipv4.ip_forward. From the first integration test on, the session removes
at its end the chains it brought (only while nothing else uses them) and puts ip_forward back
as it was; each test that runs real plugins must leave no per-pod chain behind.

Several test runs may share one machine (developers, CI). Their integration tests take turns:
each holds a machine-wide lock (tests/support/machine.py) from its setup to its teardown, so the checks
above, which compare host state before and after a test, only ever see one test's doing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.firewall import iptables_lines, pod_chains, remove_chains, remove_cni_scaffolding
from tests.support.machine import machine_turn

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


# every test under these directories of tests/ is an integration test
INTEGRATION_DIRS = {"e2e", "integration"}
# markers that imply integration
INTEGRATION_MARKERS = {"e2e", "netns"}
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        in_dir = Path(str(item.path)).resolve().relative_to(TESTS).parts[0] in INTEGRATION_DIRS
        if in_dir or any(item.get_closest_marker(m) for m in INTEGRATION_MARKERS):
            item.add_marker(pytest.mark.integration)


_ran_integration = False  # this session set up an integration test: its teardown touches the host


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Integration tests take turns with other runs' (setup, call and teardown, the session's
    own teardown included when it comes last and an integration test ran before it). Unit tests
    run as any user and need no turn."""
    global _ran_integration
    if item.get_closest_marker("integration") is None and (nextitem is not None or not _ran_integration):
        yield
        return
    _ran_integration = True
    with machine_turn():
        yield


@pytest.fixture(scope="session")
def host_state_restored():
    baseline = set(iptables_lines())
    forward = IP_FORWARD.read_text().strip()
    yield
    remove_cni_scaffolding(baseline)
    if IP_FORWARD.read_text().strip() != forward:
        IP_FORWARD.write_text(forward + "\n")


# the tests that run real plugins through pods: no pod of theirs may keep iptables chains (every
# integration test, and those of the unit folders that hold a few root tests beside unit tests)
_REAL_PLUGIN_DIRS = {"e2e", "integration", "local", "metrics", "shim"}


@pytest.fixture(autouse=True)
def no_pod_chain_left(request):
    """After each test that runs real plugins: no per-pod iptables chain (portmap's CNI-DN-,
    bridge's CNI-<hash>) it made may remain. What remains is removed, and the test fails.
    Integration tests only: a unit test runs as any user and touches no host state."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    request.getfixturevalue("host_state_restored")
    if not _REAL_PLUGIN_DIRS & set(Path(str(request.node.path)).resolve().relative_to(TESTS).parts[:-1]):
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
