"""The comparison and the expectation builder, on views made by hand (no netns, no root)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from nri_cni.node.model import (
    AddressState,
    Expectation,
    FindingKind,
    HostLink,
    LinkState,
    NetnsView,
    compare,
    expectation_from_result,
)

REPO = Path(__file__).resolve().parents[3]
NS = "/var/run/netns/pod"
IP = ipaddress.ip_interface("10.247.1.5/24")
MAC = "0a:58:0a:f7:01:05"


def view(*, up=True, carrier=True, mac=MAC, addrs=(IP,), extra=()) -> NetnsView:
    v = NetnsView(netns=NS)
    v.links["lo"] = LinkState(1, "lo", "00:00:00:00:00:00", True, True)
    v.links["eth0"] = LinkState(3, "eth0", mac, up, carrier)
    v.addresses[1] = [AddressState(ipaddress.ip_interface("127.0.0.1/8"), 254, True)]
    v.addresses[3] = [AddressState(a, 0, True) for a in addrs] + list(extra)
    return v


def exp(**kw) -> Expectation:
    base = dict(key="pod/net/eth0", netns=NS, ifname="eth0", addresses=(IP,), mac=MAC.upper())
    base.update(kw)
    return Expectation(**base)


def test_intact_attachment_is_ok():
    f = compare(exp(), view())
    assert f.ok and f.kind is FindingKind.OK and f.reason == "ok" and not f.damaged


def test_link_local_and_dynamic_addresses_are_not_extra():
    fe80 = AddressState(ipaddress.ip_interface("fe80::858:aff:fef7:105/64"), 253, True)
    slaac = AddressState(ipaddress.ip_interface("fd00::858:aff:fef7:105/64"), 0, False)
    assert compare(exp(), view(extra=[fe80, slaac])).ok


@pytest.mark.parametrize(
    "the_view, kind",
    [
        (view(up=False), FindingKind.LINK_DOWN),
        (view(carrier=False), FindingKind.NO_CARRIER),
        (view(mac="0a:58:0a:f7:01:99"), FindingKind.MAC_CHANGED),
        (view(addrs=()), FindingKind.ADDRESS_MISSING),
        (view(addrs=(IP, ipaddress.ip_interface("10.247.1.6/24"))), FindingKind.ADDRESS_EXTRA),
        (NetnsView(netns=NS, gone=True, error="no such file"), FindingKind.NETNS_GONE),
        (NetnsView(netns=NS, error="permission denied"), FindingKind.UNREADABLE),
    ],
)
def test_each_difference_has_its_kind(the_view, kind):
    f = compare(exp(), the_view)
    assert f.kind is kind and not f.ok
    assert f.damaged is (kind is not FindingKind.UNREADABLE)


def host(*links: HostLink) -> dict[str, HostLink]:
    return {h.name: h for h in links}


def test_missing_link_and_host_link():
    v = view()
    del v.links["eth0"]
    f = compare(exp(host_ifnames=("cni0", "veth1")), v, host(HostLink("veth1", 7, "veth", None)))
    assert f.kinds == {FindingKind.LINK_MISSING, FindingKind.HOST_LINK_MISSING}
    assert f.kind is FindingKind.LINK_MISSING
    assert "host link cni0 is gone" in f.reason and "no eth0" in f.reason


def test_host_veth_must_stay_a_port_of_its_bridge():
    e = exp(host_ifnames=("cni0", "veth1"))
    assert compare(e, view(), host(HostLink("cni0", 5, "bridge", None), HostLink("veth1", 7, "veth", 5))).ok
    # the bridge deleted and made again: same name, new index, the old veth is no port of it
    f = compare(e, view(), host(HostLink("cni0", 9, "bridge", None), HostLink("veth1", 7, "veth", None)))
    assert f.kinds == {FindingKind.PORT_DETACHED} and "veth1 is no port of cni0" in f.reason
    # a result without a bridge (ptp: the host veth only) has no port to check
    assert compare(exp(host_ifnames=("veth1",)), view(), host(HostLink("veth1", 7, "veth", None))).ok


def test_address_with_another_prefix_is_missing_and_extra():
    f = compare(exp(), view(addrs=(ipaddress.ip_interface("10.247.1.5/16"),)))
    assert f.kinds == {FindingKind.ADDRESS_MISSING, FindingKind.ADDRESS_EXTRA}
    assert f.to_dict()["kind"] == "address-missing"


def test_expectation_needs_netns_and_ifname():
    with pytest.raises(ValueError):
        Expectation(key="k", netns="", ifname="eth0")


BRIDGE_RESULT = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
        {"name": "veth1234", "mac": "bb:bb:bb:bb:bb:bb"},
        {"name": "eth0", "mac": "0A:58:0A:F7:01:05", "sandbox": NS},
    ],
    "ips": [
        {"address": "10.247.1.5/24", "gateway": "10.247.1.1", "interface": 2},
        {"address": "fd00:1::5/64", "interface": 2},
    ],
}


def test_expectation_from_a_bridge_result():
    e = expectation_from_result(BRIDGE_RESULT, key="k", netns=NS, ifname="eth0")
    assert e.addresses == (IP, ipaddress.ip_interface("fd00:1::5/64"))
    assert e.mac == MAC and e.host_ifnames == ("cni0", "veth1234")


def test_expectation_from_a_result_without_interface_indexes():
    res = {"interfaces": [{"name": "eth0", "sandbox": NS}], "ips": [{"address": "10.247.1.5/24"}]}
    e = expectation_from_result(res, key="k", netns=NS, ifname="eth0")
    assert e.addresses == (IP,) and e.mac is None and e.host_ifnames == ()


def test_expectation_ignores_another_interfaces_ips():
    res = dict(BRIDGE_RESULT, ips=[{"address": "10.247.9.9/24", "interface": 1}])
    assert expectation_from_result(res, key="k", netns=NS, ifname="eth0").addresses == ()


def test_importing_the_package_does_not_import_pyroute2():
    code = "import sys, nri_cni.node; assert 'pyroute2' not in sys.modules, 'pyroute2 imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("ifname", ["eth0", "net1", "a", "abcdefghijklmno"])
def test_link_request_is_what_pyroute2_encodes(ifname):
    """The GET request nri-cni encodes by hand is byte for byte the one pyroute2 encodes."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    from nri_cni.node import rtnl

    req = ifinfmsg()
    req["header"]["type"] = rtnl.RTM_GETLINK
    req["header"]["flags"] = rtnl.NLM_F_REQUEST
    req["header"]["sequence_number"] = 7
    req["attrs"] = [("IFLA_EXT_MASK", rtnl.RTEXT_FILTER_SKIP_STATS), ("IFLA_IFNAME", ifname)]
    req.encode()
    assert rtnl._request(rtnl.GETLINK, 7, ifname=ifname) == bytes(req.data)


def test_address_dump_request_is_what_pyroute2_encodes():
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

    from nri_cni.node import rtnl

    req = ifaddrmsg()
    req["header"]["type"] = rtnl.RTM_GETADDR
    req["header"]["flags"] = rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP
    req["header"]["sequence_number"] = 1010
    req["index"] = 42
    req.encode()
    assert rtnl._request(rtnl.GETADDR_DUMP, 1010, ifa_index=42) == bytes(req.data)


def test_link_and_address_messages_pyroute2_encodes_decode_the_same():
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    from nri_cni.node import rtnl

    link = ifinfmsg()
    link["header"]["type"] = 16  # RTM_NEWLINK
    link["index"] = 7
    link["flags"] = rtnl.IFF_UP | rtnl.IFF_LOWER_UP
    link["attrs"] = [
        ("IFLA_IFNAME", "veth1234"),
        ("IFLA_ADDRESS", "0a:58:0A:F4:00:02"),
        ("IFLA_MASTER", 3),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth")]}),
    ]
    link.encode()
    got = rtnl.decode_link(memoryview(bytes(link.data)))
    assert got == rtnl.Link(7, rtnl.IFF_UP | rtnl.IFF_LOWER_UP, "veth1234", "0a:58:0a:f4:00:02", 3, "veth")
    for family, text, prefix in ((2, "10.247.1.5", 24), (10, "fd00::5", 64)):
        addr = ifaddrmsg()
        addr["header"]["type"] = 20  # RTM_NEWADDR
        addr["family"], addr["prefixlen"], addr["scope"], addr["index"] = family, prefix, 0, 7
        addr["attrs"] = [("IFA_ADDRESS", text), ("IFA_FLAGS", rtnl.IFA_F_PERMANENT | 0x100)]
        addr.encode()
        got_addr = rtnl.decode_address(memoryview(bytes(addr.data)))
        assert got_addr == rtnl.Address(7, prefix, 0, rtnl.IFA_F_PERMANENT | 0x100, text)


def test_a_daemon_that_verifies_never_imports_pyroute2():
    """pyroute2 costs ~10 MiB for the life of the process: verify decodes netlink itself."""
    code = (
        "import sys, asyncio\n"
        "from nri_cni.node import Expectation, NodeInspector\n"
        "ins = NodeInspector.with_workers()\n"
        "exp = Expectation(key='lo', netns='/proc/self/ns/net', ifname='lo')\n"
        "[f] = asyncio.run(ins.inspect([exp]))\n"
        "ins.close()\n"
        "assert f.kind.value in ('ok', 'address-extra', 'unreadable'), f\n"
        "assert 'pyroute2' not in sys.modules, 'pyroute2 imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_expectation_from_a_0_2_0_result():
    res = {"cniVersion": "0.2.0", "ip4": {"ip": "10.247.1.5/24", "gateway": "10.247.1.1"}}
    e = expectation_from_result(res, key="k", netns=NS, ifname="eth0")
    assert e.addresses == (IP,) and e.mac is None and e.host_ifnames == ()


@pytest.mark.parametrize("oif", [None, 5, 70000])
def test_route_dump_request_is_what_pyroute2_encodes(oif):
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    from nri_cni.node import rtnl

    req = rtmsg()
    req["header"]["type"] = rtnl.RTM_GETROUTE
    req["header"]["flags"] = rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP
    req["header"]["sequence_number"] = 4242
    req["family"] = 0  # AF_UNSPEC: both families (pyroute2's own default is AF_INET)
    if oif is not None:  # the main table's routes through one link
        req["table"] = rtnl.RT_TABLE_MAIN
        req["attrs"] = [("RTA_OIF", oif)]
    req.encode()
    assert rtnl._route_request(4242, oif) == bytes(req.data)


ROUTES = [
    # (family, dst, dst_len, gateway, oif, table): table past 255 goes in RTA_TABLE only
    (2, "10.246.0.0", 16, "10.247.1.1", 7, 254),
    (2, None, 0, "10.247.1.1", 7, 254),  # the default route has no RTA_DST
    (10, "fd00:1::", 64, "fd00::1", 3, 1000),
    (10, None, 0, None, None, 254),
]


@pytest.mark.parametrize("family, dst, dst_len, gateway, oif, table", ROUTES)
def test_route_messages_pyroute2_encodes_decode_the_same(family, dst, dst_len, gateway, oif, table):
    import ipaddress

    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    from nri_cni.node import rtnl
    from nri_cni.node.model import RouteState

    msg = rtmsg()
    msg["header"]["type"] = 24  # RTM_NEWROUTE
    msg["family"], msg["dst_len"], msg["table"] = family, dst_len, min(table, 252)
    msg["attrs"] = [("RTA_TABLE", table)]
    if dst is not None:
        msg["attrs"].append(("RTA_DST", dst))
    if gateway is not None:
        msg["attrs"].append(("RTA_GATEWAY", gateway))
    if oif is not None:
        msg["attrs"].append(("RTA_OIF", oif))
    msg.encode()
    any_dst = "0.0.0.0" if family == 2 else "::"
    assert rtnl.decode_route(memoryview(bytes(msg.data))) == RouteState(
        dst=ipaddress.ip_network(f"{dst or any_dst}/{dst_len}"),
        gw=ipaddress.ip_address(gateway) if gateway else None,
        oif=oif,
        table=table,
    )


def test_control_a_route_of_another_family_decodes_to_none():
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    from nri_cni.node import rtnl

    msg = rtmsg()
    msg["header"]["type"] = 24
    msg["family"] = 7  # AF_BRIDGE: the same message with only the family changed
    msg["attrs"] = [("RTA_TABLE", 254), ("RTA_OIF", 7)]
    msg.encode()
    assert rtnl.decode_route(memoryview(bytes(msg.data))) is None
