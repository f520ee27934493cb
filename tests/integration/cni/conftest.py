"""Fixtures for the CNI runtime tests against the real plugins (containernetworking-plugins 1.9.1
from Debian sid, extracted under $NRI_CNI_DEPS/root/usr/lib/cni by .ci/install-deps).

A missing plugin, tool or privilege FAILS the tests (never skips them).

Every test gets a `CniEnv`: its own netns, cache dir, host-local dataDir, tuning dataDir and a
/24 in 10.247-249/16 that nothing on the host uses right now, plus a Janitor that removes the
links and namespaces at teardown even when the test failed.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:  # `tests.support` is imported as a package from the repo root
    sys.path.insert(0, str(REPO))

from tests.integration.cni.helpers import CniEnv, DirectCNI, run  # noqa: E402
from tests.support.bin_dir import REAL_PLUGINS  # noqa: E402
from tests.support.firewall import purge_firewall_rules  # noqa: E402
from tests.support.hostlocal import host_local_reservations  # noqa: E402
from tests.support.janitor import Janitor  # noqa: E402
from tests.support.names import free_subnet, unique_name  # noqa: E402

REQUIRED_PLUGINS = (
    "bridge",
    "host-local",
    "loopback",
    "portmap",
    "tuning",
    "firewall",
    "ptp",
    "macvlan",
    "host-device",
    "static",
)
REQUIRED_TOOLS = ("iptables", "iptables-save", "ip6tables-save", "nft", "ip")


@pytest.fixture(scope="session")
def cni_bin_dir() -> str:
    if os.geteuid() != 0:
        pytest.fail("the real-plugin CNI tests need root (netns, veth, iptables)")
    missing = [p for p in REQUIRED_PLUGINS if not os.access(REAL_PLUGINS / p, os.X_OK)]
    if missing:
        pytest.fail(f"CNI plugins missing in {REAL_PLUGINS}: {missing} (run .ci/install-deps)")
    tools = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if tools:
        pytest.fail(f"tools missing on PATH: {tools}")
    return str(REAL_PLUGINS)


@pytest.fixture(scope="session")
def ip_forward_restored():
    """The bridge plugin with isGateway turns on net.ipv4.ip_forward for the whole host;
    put back what was there when the session started."""
    path = Path("/proc/sys/net/ipv4/ip_forward")
    before = path.read_text().strip()
    yield
    if path.read_text().strip() != before:
        path.write_text(before + "\n")


@pytest.fixture
def cni_env(tmp_path, cni_bin_dir, request) -> CniEnv:
    jan = Janitor()
    request.addfinalizer(jan.cleanup_or_raise)
    ns = jan.netns()
    env = CniEnv(
        tmp=tmp_path,
        bin_dir=cni_bin_dir,
        jan=jan,
        ns=ns,
        subnet=free_subnet(24),
        net_name=unique_name("net", length=20),
        cid="nct-" + uuid.uuid4().hex,
        cache_dir=tmp_path / "cache",
        data_dir=tmp_path / "ipam",
        tuning_dir=tmp_path / "tuning",
    )
    # runs before the janitor (finalizers run last-in first-out)
    request.addfinalizer(lambda: _undo_attachments(env))
    return env


def _undo_attachments(env: CniEnv) -> None:
    """After a test that did not get to its DEL: DEL what is still cached, then delete any
    firewall rule that still names the test's containers, networks or addresses."""
    markers = {env.cid, env.net_name, *env.cids}
    markers.update(r.ip for r in host_local_reservations(env.data_dir))
    markers.update(r.container_id for r in host_local_reservations(env.data_dir))
    try:
        from nri_cni.cni.cache import ResultCache

        entries = ResultCache(str(env.cache_dir)).entries()
    except Exception:  # the runtime under test may be what is broken
        entries = []
    for entry in entries:
        markers.update((entry.container_id, entry.network_name))
        for ip in (entry.result or {}).get("ips", []):
            markers.add(str(ip.get("address", "")).split("/")[0])
        try:
            run(env.runtime().delete_cached(entry))
        except Exception:
            pass
    purge_firewall_rules(markers)


@pytest.fixture
def direct(cni_bin_dir) -> DirectCNI:
    return DirectCNI(cni_bin_dir)
