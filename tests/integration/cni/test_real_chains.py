"""ADD / CHECK / DEL of real plugin chains through nri-cni's CNIRuntime, checked with netlink,
iptables and the file system, and nothing left behind after DEL."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.integration.cni.helpers import (
    CniEnv,
    assert_result_matches_netlink,
    random_port,
    run,
)
from tests.support.conflists import bridge_plugin
from tests.support.firewall import iptables_lines
from tests.support.hostlocal import host_local_reservations
from tests.support.names import unique_name
from tests.support.netns import delete_link, get_link

pytestmark = pytest.mark.netns


def _bridge_chain(env: CniEnv, bridge: str) -> dict:
    return env.conflist(
        bridge_plugin(bridge, env.host_local()),
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False, "backend": "iptables"},
        {
            "type": "tuning",
            "mtu": 1400,
            "dataDir": str(env.tuning_dir),
            "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
        },
        {"type": "firewall", "backend": "iptables"},
    )


def _sandbox_ip(result) -> str:
    for ip in result.ips:
        if result.interfaces[ip.interface].sandbox:
            return ip.address.split("/")[0]
    raise AssertionError(f"no sandbox IP in {result}")


def _host_veth(result, bridge: str) -> str:
    names = [i.name for i in result.interfaces if not i.sandbox and i.name != bridge]
    assert len(names) == 1, result.interfaces
    return names[0]


def _tcp_roundtrip_through_portmap(env: CniEnv, pod_ip: str, container_port: int, host_port: int):
    """A listener in the pod on pod_ip:container_port; the host connects to gateway:host_port,
    which only portmap's DNAT can send to the pod."""
    token = uuid.uuid4().hex
    code = (
        "import socket,sys\n"
        f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        f"s.bind(({pod_ip!r},{container_port}));s.listen(1)\n"
        "print('ready',flush=True)\n"
        "s.settimeout(10);c,_=s.accept();c.sendall(sys.argv[1].encode());c.close()\n"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", env.ns.name, sys.executable, "-I", "-S", "-c", code, token],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        got = b""
        deadline = time.monotonic() + 60
        with socket.create_connection((env.gateway, host_port), timeout=60) as s:
            while len(got) < len(token) and time.monotonic() < deadline:
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
        assert got.decode() == token
    finally:
        proc.kill()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------
# a. bridge + host-local + portmap + tuning + firewall


def test_bridge_portmap_tuning_firewall_add_check_del(cni_env: CniEnv, ip_forward_restored):
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)  # the bridge plugin makes it; DEL leaves it (by design)
    net = env.net(_bridge_chain(env, bridge))
    host_port, container_port = random_port(), 8080
    caps = {
        "portMappings": [
            {"hostPort": host_port, "containerPort": container_port, "protocol": "tcp", "hostIP": env.gateway}
        ]
    }
    conf = env.rtconf(
        args=[("K8S_POD_NAMESPACE", "nct"), ("K8S_POD_NAME", "pod-a"), ("IgnoreUnknown", "1")], caps=caps
    )
    rt = env.runtime()
    leaks = env.leak_checker(bridges=[bridge]).start()

    result = run(rt.add(net, conf))

    # what the result claims is what netlink sees, in the netns and on the host
    assert_result_matches_netlink(result, env)
    pod_ip = _sandbox_ip(result)
    assert ipaddress.ip_address(pod_ip) in env.subnet
    br = get_link(bridge)
    assert br is not None and br.kind == "bridge" and br.has_addr(f"{env.gateway}/24")
    veth = get_link(_host_veth(result, bridge))
    assert veth.kind == "veth" and veth.master == br.index
    eth0 = env.ns.link("eth0")
    assert eth0.kind == "veth" and eth0.mtu == 1400  # tuning's mtu
    assert env.ns.sysctl("net.ipv4.conf.eth0.arp_notify") == "1"  # tuning's sysctl
    assert not [r for r in env.ns.routes() if r["dst"] == "default"]  # no route out
    # host-local's reservation, visible in the per-test dataDir
    assert [(r.ip, r.container_id, r.ifname) for r in host_local_reservations(env.data_dir)] == [
        (pod_ip, env.cid, "eth0")
    ]
    # portmap and firewall rules exist, and the mapping works end to end
    ipt = iptables_lines()
    assert any(
        f"--dport {host_port}" in line and f"--to-destination {pod_ip}:{container_port}" in line
        for line in ipt
    ), "portmap DNAT rule"
    assert any(f"{pod_ip}/32" in line and "CNI-FORWARD" in line for line in ipt), "firewall rules"
    _tcp_roundtrip_through_portmap(env, pod_ip, container_port, host_port)
    # the cache entry
    assert env.cache_files() == [f"{env.net_name}-{env.cid}-eth0"]

    leaks.add_markers(pod_ip)
    leaks.learn()
    assert veth.name in leaks.host_links

    run(rt.check(net, conf))

    run(rt.delete(net, conf))
    assert host_local_reservations(env.data_dir) == []
    assert env.cache_files() == []
    leaks.assert_clean()
    # a second DEL is fine (SPEC: repeated DELs are allowed)
    run(rt.delete(net, conf))
    leaks.assert_clean()


def test_bridge_check_fails_after_host_veth_deleted(cni_env: CniEnv, ip_forward_restored):
    from nri_cni.errors import CNIError

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    net = env.net(_bridge_chain(env, bridge))
    caps = {
        "portMappings": [
            {"hostPort": random_port(), "containerPort": 80, "protocol": "tcp", "hostIP": env.gateway}
        ]
    }
    conf = env.rtconf(caps=caps)
    rt = env.runtime()
    # not the tuning dataDir: tuning 1.9.1 keeps its backup file when the interface is gone at
    # DEL (restoreBackup returns early when LinkByName fails), which is the plugin's business
    leaks = env.leak_checker(bridges=[bridge], dirs=[env.cache_dir, env.data_dir]).start()

    result = run(rt.add(net, conf))
    leaks.add_markers(_sandbox_ip(result))
    leaks.learn()
    run(rt.check(net, conf))

    host_veth = _host_veth(result, bridge)
    assert delete_link(host_veth)  # the pod's eth0 goes with it
    with pytest.raises(CNIError) as ei:
        run(rt.check(net, conf))
    assert ei.value.ref.command == "CHECK", ei.value
    assert ei.value.ref.plugin == "bridge", ei.value

    run(rt.delete(net, conf))
    leaks.assert_clean()


# --------------------------------------------------------------------------------------------
# b. macvlan over a veth master


def test_macvlan_over_veth_master(cni_env: CniEnv):
    env = cni_env
    master, _other = env.jan.veth()  # both ends on the host
    net = env.net(
        env.conflist({"type": "macvlan", "master": master, "mode": "bridge", "ipam": env.host_local()})
    )
    conf = env.rtconf()
    rt = env.runtime()
    leaks = env.leak_checker().start()

    result = run(rt.add(net, conf))
    assert_result_matches_netlink(result, env)
    eth0 = env.ns.link("eth0")
    assert eth0.kind == "macvlan"
    assert [r.ip for r in host_local_reservations(env.data_dir)] == [_sandbox_ip(result)]
    leaks.add_markers(_sandbox_ip(result))
    leaks.learn()

    run(rt.check(net, conf))
    run(rt.delete(net, conf))
    assert get_link(master) is not None  # the master is the test's, untouched
    leaks.assert_clean()


# --------------------------------------------------------------------------------------------
# c. ptp


def test_ptp_host_local(cni_env: CniEnv, ip_forward_restored):
    env = cni_env
    net = env.net(env.conflist({"type": "ptp", "ipMasq": False, "mtu": 1450, "ipam": env.host_local()}))
    conf = env.rtconf()
    rt = env.runtime()
    leaks = env.leak_checker().start()

    result = run(rt.add(net, conf))
    assert_result_matches_netlink(result, env)
    pod_ip = _sandbox_ip(result)
    host_ifs = [i.name for i in result.interfaces if not i.sandbox]
    assert len(host_ifs) == 1
    host_veth = get_link(host_ifs[0])
    assert host_veth.kind == "veth" and host_veth.mtu == 1450
    assert env.ns.link("eth0").mtu == 1450
    # ptp routes the pod's /32 to the host veth
    from tests.support.netns import list_routes

    assert any(r["dst"] == f"{pod_ip}/32" and r["dev"] == host_veth.name for r in list_routes())
    leaks.add_markers(pod_ip)
    leaks.learn()
    assert host_veth.name in leaks.host_links

    run(rt.check(net, conf))
    run(rt.delete(net, conf))
    assert not any(r["dst"] == f"{pod_ip}/32" for r in list_routes())
    leaks.assert_clean()


# --------------------------------------------------------------------------------------------
# d. host-device


def test_host_device_moves_a_veth_end_in_and_out(cni_env: CniEnv):
    env = cni_env
    dev, _peer = env.jan.veth()
    before = get_link(dev)
    net = env.net(env.conflist({"type": "host-device", "device": dev, "ipam": env.host_local()}))
    conf = env.rtconf()
    rt = env.runtime()
    leaks = env.leak_checker().start()

    result = run(rt.add(net, conf))
    assert_result_matches_netlink(result, env)
    assert get_link(dev) is None, "the device should have left the host"
    eth0 = env.ns.link("eth0")
    assert eth0.mac == before.mac and eth0.kind == "veth"
    leaks.add_markers(_sandbox_ip(result))
    leaks.learn()

    run(rt.check(net, conf))
    run(rt.delete(net, conf))
    back = get_link(dev)
    assert back is not None and back.mac == before.mac, "DEL should give the device back"
    assert not back.addrs or all(a.startswith("fe80:") for a in back.addrs)
    leaks.assert_clean()


# --------------------------------------------------------------------------------------------
# e. static IPAM


def test_bridge_with_static_ipam(cni_env: CniEnv):
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    addr = env.cidr(7)
    net = env.net(
        env.conflist(
            bridge_plugin(bridge, {"type": "static", "addresses": [{"address": addr}]}, gateway=False)
        )
    )
    conf = env.rtconf()
    rt = env.runtime()
    leaks = env.leak_checker(bridges=[bridge], markers=[env.host(7)]).start()

    result = run(rt.add(net, conf))
    assert_result_matches_netlink(result, env)
    assert [ip.address for ip in result.ips] == [addr]
    assert env.ns.link("eth0").has_addr(addr)
    leaks.learn()
    assert len(leaks.host_links) == 1

    run(rt.check(net, conf))
    run(rt.delete(net, conf))
    leaks.assert_clean()
