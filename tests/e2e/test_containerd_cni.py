"""The test harness itself against real containerd: its own CNI (bridge + host-local + portmap)
gives a pod an address, and stop/remove leave nothing behind; pods survive a restart."""

from __future__ import annotations

import ipaddress
import os
import time
import uuid

import pytest

from tests.support.cri import PortMapping
from tests.support.hostnet import bridge_ports, cni_cache_files, link_exists, netns_addrs, netns_routes

pytestmark = pytest.mark.e2e


def _pause_pid(status_info: dict) -> int:
    return int(status_info["info"]["pid"])


def test_pod_gets_ip_and_leaves_nothing_behind(bridge_network, make_containerd):
    net = bridge_network
    ctd = make_containerd(cni_conf_dir=net.conf_dir)
    assert ctd.start_seconds is not None  # CRI answered (its seconds are printed below, not asserted)

    t0 = time.monotonic()
    pod = ctd.cri.run_pod(
        "web-0",
        "nct-e2e",
        str(uuid.uuid4()),
        labels={"app": "web"},
        port_mappings=[PortMapping(container_port=80, host_port=18080, host_ip=net.gateway)],
    )
    run_seconds = time.monotonic() - t0
    st = ctd.cri.pod_status(pod)
    assert st.ready, st
    assert (st.name, st.namespace) == ("web-0", "nct-e2e")
    assert ipaddress.ip_address(st.ip) in net.network, st.ip
    assert st.ip != net.gateway
    assert st.netns_path and os.path.exists(st.netns_path), st.netns_path
    assert f"{st.ip}/{net.network.prefixlen}" in netns_addrs(st.netns_path)
    routes = netns_routes(st.netns_path)
    assert not [r for r in routes if r.startswith("default")], routes  # no way out
    assert any(r.startswith(f"{net.subnet} dev eth0") for r in routes), routes
    # host side: one veth on the bridge, the reservation, the cache file, the DNAT rule
    assert link_exists(net.bridge)
    assert len(bridge_ports(net.bridge)) == 1
    assert net.reservations() == {st.ip: f"{pod} eth0"}
    assert [p.name for p in cni_cache_files(pod)] == sorted(
        [f"cni-loopback-{pod}-lo", f"{net.name}-{pod}-eth0"]
    )
    assert any(f"--to-destination {st.ip}:80" in ln for ln in _dnat_lines(net, pod))
    assert [p.id for p in ctd.cri.list_pods()] == [pod]

    ctd.cri.stop_pod(pod)
    assert not ctd.cri.pod_status(pod).ready
    assert not os.path.exists(st.netns_path)
    assert bridge_ports(net.bridge) == []
    assert net.reservations() == {}
    assert cni_cache_files(pod) == []
    assert _dnat_lines(net, pod) == []
    ctd.cri.remove_pod(pod)
    assert ctd.cri.list_pods() == []
    assert not ctd.shim_socket(pod).exists()
    assert ctd.shim_pids() == []
    print(f"containerd start {ctd.start_seconds:.3f}s, RunPodSandbox {run_seconds:.3f}s")


def _dnat_lines(net, pod_id: str) -> list[str]:
    """portmap's rules for this pod: the jump naming it, and the rules of its CNI-DN chain."""
    jumps = net.nat_rules_for(pod_id)
    chains = {ln.split(" -j ")[-1].split()[0] for ln in jumps if " -j CNI-DN-" in ln}
    return jumps + [ln for c in chains for ln in net.nat_rules_for(f"-A {c} ")]


def test_pod_survives_containerd_restart(bridge_network, make_containerd):
    net = bridge_network
    ctd = make_containerd(cni_conf_dir=net.conf_dir)
    pod = ctd.cri.run_pod("db-0", "nct-e2e", str(uuid.uuid4()))
    before = ctd.cri.pod_status(pod)
    assert before.ready and ipaddress.ip_address(before.ip) in net.network

    ctd.restart()
    assert ctd.start_seconds is not None  # CRI answered again after the restart
    print(f"containerd restart {ctd.start_seconds:.3f}s")
    listed = ctd.cri.list_pods()
    assert [(p.id, p.ready) for p in listed] == [(pod, True)]
    after = ctd.cri.pod_status(pod)
    assert after.ready
    assert (after.ip, after.netns_path) == (before.ip, before.netns_path)
    assert _pause_pid(after.info) == _pause_pid(before.info)  # the same pause process
    assert os.path.exists(after.netns_path)
    assert f"{after.ip}/{net.network.prefixlen}" in netns_addrs(after.netns_path)

    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)
    assert ctd.cri.list_pods() == []
    assert not os.path.exists(before.netns_path)
    assert bridge_ports(net.bridge) == []
    assert net.reservations() == {}
    assert cni_cache_files(pod) == []
    assert ctd.shim_pids() == []
