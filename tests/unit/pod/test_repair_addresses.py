"""How a repair asks for a pod's addresses, without root: the IPs a cached result holds and which
pod holds each, the repair's selection (the attachment's own config and capability args), which
address an IPAM refusal names, and a chain that cannot be asked for addresses left untouched.
(The real rounds: tests/integration/pod/test_verify_repair.py.)"""

from __future__ import annotations

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
    eth0 = _entry("pod-a", "eth0", "10.0.0.2/24")
    gone = _entry("pod-a", "net1", "10.9.0.2/24", network="retired")
    out = repair_selection(selected, [eth0, gone], [("podnet", "eth0"), ("retired", "net1")])
    assert [(s.network.name, s.ifname) for s in out] == [("podnet", "eth0"), ("retired", "net1")]
    assert out[0].capability_args == {"portMappings": [1]}  # the runtime's, from the cache
    assert out[0].network.default and out[0].network.conflist.bytes == eth0.config
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
    with pytest.raises(IpsNotRequestable, match="dhcpnet"):
        asyncio.run(
            repairer.repair(
                pod,
                selected=[Selected(NetworkSpec(name="dhcpnet", conflist=net), "eth0", {})],
                damaged=[],
                ips={("dhcpnet", "eth0"): ("192.0.2.7/24",)},
                wrong=["eth0 lacks 192.0.2.7/24"],
            )
        )
    assert touched == ["emit:IpsNotRequestable"]  # one record, nothing DELed or ADDed
