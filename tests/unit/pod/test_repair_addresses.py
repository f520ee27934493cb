"""How a repair asks for a pod's addresses, without root: the IPs a cached result holds and which
pod holds each, the repair's selection (the attachment's own config and capability args), which
address an IPAM refusal names, and a chain that cannot be asked for addresses left untouched.
(The real rounds: tests/integration/pod/test_verify_repair.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import parse_config
from nri_cni.pod.repair import ip_holders, repair_selection, result_ips
from tests.support.configdocs import podnet_doc


def _entry(pod: str, ifname: str, *ips: str, network: str = "podnet") -> CacheEntry:
    conf = b'{"cniVersion":"1.1.0","name":"%s","plugins":[{"type":"bridge"}]}' % network.encode()
    result = {"cniVersion": "1.1.0", "ips": [{"address": a} for a in ips]}
    return CacheEntry(
        pod, ifname, network, conf, "/run/netns/x", capability_args={"portMappings": [1]}, result=result
    )


def test_result_ips_and_holders():
    a = _entry("pod-a", "eth0", "10.0.0.2/24", "fd00::2/64")
    b = _entry("pod-b", "eth0", "10.0.0.3/24")
    old = CacheEntry(
        "pod-c", "eth0", "old", b"{}", result={"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.4/24"}}
    )
    assert result_ips(a) == ("10.0.0.2/24", "fd00::2/64")
    assert result_ips(old) == ("10.1.0.4/24",)
    old6 = {"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.5/24"}, "ip6": {"ip": "fd01::5/64"}}
    assert result_ips(CacheEntry("pod-d", "eth0", "old", b"{}", result=old6)) == ("10.1.0.5/24", "fd01::5/64")
    # control of the first: entries that hold no address are no address
    odd = {"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.6/24"}, {"interface": 0}, "10.0.0.7/24"]}
    assert result_ips(CacheEntry("pod-e", "eth0", "podnet", b"{}", result=odd)) == ("10.0.0.6/24",)
    assert ip_holders([a, b, old]) == {
        "10.0.0.2": "pod-a",
        "fd00::2": "pod-a",
        "10.0.0.3": "pod-b",
        "10.1.0.4": "pod-c",
    }


def test_repair_selection_keeps_the_attachments_config_and_capability_args():
    cfg = parse_config(podnet_doc())
    from nri_cni.pod.select import Selected

    selected = [Selected(cfg.networks[0], "eth0")]
    # made with another config than the one in force now (a reload since): the cache's counts
    made_with = b'{"cniVersion":"1.1.0","name":"podnet","plugins":[{"type":"bridge","mtu":1400}]}'
    eth0 = dataclasses.replace(_entry("pod-a", "eth0", "10.0.0.2/24"), config=made_with)
    gone = _entry("pod-a", "net1", "10.9.0.2/24", network="retired")
    out = repair_selection(selected, [eth0, gone], [("podnet", "eth0"), ("retired", "net1")])
    assert [(s.network.name, s.ifname) for s in out] == [("podnet", "eth0"), ("retired", "net1")]
    assert out[0].capability_args == {"portMappings": [1]}  # the runtime's, from the cache
    assert out[0].network.default and out[0].network.conflist.bytes == made_with
    assert cfg.networks[0].conflist.bytes != made_with  # control: the config in force differs
    assert out[1].network.conflist.name == "retired"


def test_an_ipam_refusal_names_the_address_and_a_parse_error_is_no_refusal():
    from nri_cni.errors import CNIError
    from nri_cni.pod.repair import _refused_address

    asked = [("10.77.0.8/24", "fd77:77::4/64")]
    refused = CNIError(
        999, "failed to allocate for range 0: requested IP address 10.77.0.8 is not available in range set"
    )
    assert _refused_address(refused, asked) == "10.77.0.8"
    # host-local's answer to CNI_ARGS IP=a,b names both addresses and refuses neither
    unparsed = CNIError(
        999, 'ARGS: error parsing value of pair "IP=10.77.0.8,fd77:77::4": invalid IP address'
    )
    assert _refused_address(unparsed, asked) == ""
    # an address that only begins another is not named (10.77.0.8 in 10.77.0.80)
    other = CNIError(999, "requested IP address 10.77.0.80 is not available in range set")
    assert _refused_address(other, asked) == ""


def test_a_repair_of_a_chain_that_cannot_be_asked_for_addresses_touches_nothing():
    import asyncio

    from nri_cni.cni.config import parse_conflist
    from nri_cni.config import NetworkSpec
    from nri_cni.pod.model import PodInfo
    from nri_cni.pod.repair import IpsNotRequestable, Repairer
    from nri_cni.pod.select import Selected

    net = parse_conflist(
        {"cniVersion": "1.1.0", "name": "dhcpnet", "plugins": [{"type": "macvlan", "ipam": {"type": "dhcp"}}]}
    )
    touched: list[str] = []

    class Untouchable:  # a collaborator repair must not use before it knows it can ask
        def __getattr__(self, name):
            touched.append(name)
            raise AssertionError(f"repair touched {name}")

    class CNI:
        cache = type("Cache", (), {"entries": lambda self, **kw: []})()

    class Log:
        def emit(self, record):
            touched.append("emit:" + (record.error.__class__.__name__ if record.error else "ok"))

    repairer = Repairer(CNI(), rollback=Untouchable(), attacher=Untouchable(), oplog=Log())
    pod = PodInfo("a" * 64, name="p", namespace="default", netns="/run/netns/x")
    with pytest.raises(IpsNotRequestable) as err:
        asyncio.run(
            repairer.repair(
                pod,
                selected=[Selected(NetworkSpec(name="dhcpnet", conflist=net), "eth0", {})],
                damaged=[],
                ips={("dhcpnet", "eth0"): ("192.0.2.7/24", "2001:db8::7/64")},
                wrong=["eth0 lacks 192.0.2.7/24"],
            )
        )
    assert str(err.value) == (
        "pod default/p: network 'dhcpnet' (eth0) must get 192.0.2.7, 2001:db8::7 back, and no plugin "
        "of its chain can be asked for an address (no `ips` capability, no IPAM that reads "
        "args.cni.ips): not cut, as a new ADD would give it other IPs"
    )
    assert touched == ["emit:IpsNotRequestable"]  # one record, nothing DELed or ADDed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("requested IP address 10.77.0.8 is not available in range set", "10.77.0.8"),
        ("10.77.0.8 has been allocated to pod-b", "10.77.0.8"),
        ("address 10.77.0.8 already reserved", "10.77.0.8"),
        ("address 10.77.0.8 in use", "10.77.0.8"),
        ("address 10.77.0.8 reserved", "10.77.0.8"),
        ("fd77:77::4 is NOT AVAILABLE", "fd77:77::4"),  # the words in any case
        ("fd77:77::40 is not available", ""),  # a longer address (hex digit after)
        ("fd77:77::4:1 is not available", ""),  # a longer address (a colon after)
        ("10.77.0.8.1 is not available", ""),  # a longer dotted string
        ("10.77.0.80 and 10.77.0.8 are not available", "10.77.0.8"),  # the second mention counts
        ("10.77.0.8 and 10.77.0.80 are not available", "10.77.0.8"),  # the first, a longer one after
        ("10.77.0.80 10.77.0.8 10.77.0.81 not available", "10.77.0.8"),  # the next mention, not the last
        ("not available: 10.77.0.8", "10.77.0.8"),  # at the very end
        ("10.77.0.8 cannot be parsed", ""),  # no refusal word: control case of the first row
        ("not available: 10.77.0.9", ""),  # another address: nothing asked is refused
    ],
)
def test_what_counts_as_an_ipam_refusal(text, expected):
    """Control cases: the first row against "cannot be parsed" (the refusal word removed) and
    against 10.77.0.9 (the address changed)."""
    from nri_cni.errors import PodError
    from nri_cni.pod.repair import _refused_address

    assert str(PodError(text)) == text
    assert _refused_address(PodError(text), [("10.77.0.8/24", "fd77:77::4/64")]) == expected


def test_a_refusal_in_a_cause_counts():
    """The ADD's error wraps the IPAM's (its cause). Control case: the same outer error alone."""
    from nri_cni.errors import CNIError, PodError
    from nri_cni.pod.repair import _refused_address

    outer = PodError("ADD of podnet failed")
    assert _refused_address(outer, [("10.77.0.8/24",)]) == ""
    try:
        raise outer from CNIError(999, "requested IP address 10.77.0.8 is not available")
    except PodError as exc:
        assert _refused_address(exc, [("10.77.0.8/24",)]) == "10.77.0.8"
    wrapped = PodError("ADD of podnet failed", cause=CNIError(999, "10.77.0.8 already in use"))
    assert _refused_address(wrapped, [("10.77.0.8/24",)]) == "10.77.0.8"


@pytest.mark.parametrize(
    "iface, mac",
    [
        ({"name": "lo", "mac": "aa:bb:cc:dd:ee:ff"}, "00:00:00:00:00:00"),  # host side: as now
        ({"name": "lo", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/run/netns/x"}, "aa:bb:cc:dd:ee:ff"),
        ({"name": "no-such-link0", "mac": "aa:bb:cc:dd:ee:ff"}, "aa:bb:cc:dd:ee:ff"),  # gone: CHECK says so
        ({"name": "../net/lo", "mac": "aa:bb:cc:dd:ee:ff"}, "aa:bb:cc:dd:ee:ff"),  # no interface name
        ({"mac": "aa:bb:cc:dd:ee:ff"}, "aa:bb:cc:dd:ee:ff"),
        ("lo", None),  # no object: kept as it is
    ],
)
def test_host_macs_as_now(iface, mac):
    """Only a host-side interface that exists takes its MAC of now (the loopback's, all zeros).
    Control case: the first row against the same interface with a sandbox (the pod's own)."""
    from nri_cni.pod.repair import host_macs_as_now

    prev = {"cniVersion": "1.1.0", "interfaces": [iface], "ips": []}
    out = host_macs_as_now(prev)
    assert (out["interfaces"][0]["mac"] if mac is not None else out["interfaces"][0]) == (mac or iface)
    assert {k: v for k, v in out.items() if k != "interfaces"} == {"cniVersion": "1.1.0", "ips": []}
    assert prev["interfaces"][0] is iface  # the cached result itself is not changed


def test_host_macs_as_now_without_an_interface_list():
    from nri_cni.pod.repair import host_macs_as_now

    prev = {"cniVersion": "1.1.0", "interfaces": "eth0"}
    assert host_macs_as_now(prev) is prev


@pytest.mark.parametrize("depth, expected", [(8, "10.77.0.8"), (9, "")])
def test_a_refusal_is_read_up_to_8_errors_deep(depth, expected):
    """The refusal is the innermost of a chain of causes `depth` long: read up to the 8th (a
    chain that loops ends). Control case: one error more and it is not read."""
    from nri_cni.errors import NriCniError
    from nri_cni.pod.repair import _refused_address

    inner: BaseException = ValueError("10.77.0.8 already in use")
    for _ in range(depth - 2):  # errors whose text is their own only
        outer = ValueError("wrapped")
        outer.__cause__ = inner
        inner = outer
    exc = NriCniError("ADD of podnet failed")
    exc.__cause__ = inner
    assert _refused_address(exc, [("10.77.0.8/24",)]) == expected


def test_a_cause_chain_that_loops_ends():
    from nri_cni.errors import PodError
    from nri_cni.pod.repair import _refused_address

    exc = PodError("ADD of podnet failed")
    exc.__cause__ = exc
    assert _refused_address(exc, [("10.77.0.8/24",)]) == ""


@pytest.mark.parametrize(
    "address, plain_address",
    [("10.77.0.8/24", "10.77.0.8"), ("10.77.0.8", "10.77.0.8"), ("fd77::4/64", "fd77::4"), ("a/b/c", "a")],
)
def test_plain_is_the_address_before_its_first_slash(address, plain_address):
    """Control case: the last row (two slashes: the part before the first)."""
    from nri_cni.pod.repair import plain

    assert plain(address) == plain_address


def test_a_refusal_split_over_an_error_and_its_cause_counts():
    """The address ends the outer error's text, the refusal is its cause's: read as one text
    (a space between), through a PodError's cause and that cause's own. Control: the same
    address with the refusal nowhere in the chain."""
    from nri_cni.errors import PodError
    from nri_cni.pod.repair import _refused_address

    def chain(words: str) -> PodError:
        inner = PodError("ADD for 10.77.0.8")
        inner.__cause__ = ValueError(words)
        return PodError("ADD of podnet failed", cause=inner)

    assert _refused_address(chain("already in use"), [("10.77.0.8/24",)]) == "10.77.0.8"
    assert _refused_address(chain("could not be parsed"), [("10.77.0.8/24",)]) == ""


@pytest.mark.parametrize("text, expected", [("::: not available", "::"), (":: not available", "::")])
def test_the_search_for_the_address_goes_on_from_the_next_character(text, expected):
    """ "::" is followed by ":" where it begins the text (a longer one), and is found one
    character on. Control case: the same address alone."""
    from nri_cni.errors import PodError
    from nri_cni.pod.repair import _refused_address

    assert _refused_address(PodError(text), [("::/0",)]) == expected
