"""Which networks a pod gets, and under which interface names: the default networks, then the
ones its annotation asks for (names or the JSON form with IPs and MAC); every untrusted request
refused; in secondary mode eth0 is the runtime's, in the modes that own it the primary network
comes first as eth0."""

from __future__ import annotations

import json

import pytest

from nri_cni.errors import AnnotationRefused
from nri_cni.pod.model import PrimaryNetwork
from nri_cni.pod.select import select_networks
from nri_cni.service.modes import mode_for
from tests.support.configdocs import bridge_net, parse_networks


def _sel_cfg(mode="native"):
    return parse_networks(
        [
            bridge_net("podnet", default=True),
            bridge_net("fast", namespaces=["default"]),
            bridge_net("storage", namespaces=["*"], interface="stor0"),
            bridge_net("admin", namespaces=["kube-system"]),
        ],
        mode=mode,
        **({"primary_network": "cbr0"} if mode == "secondary" else {}),
    )


def test_defaults_then_requests_with_interface_names():
    cfg = _sel_cfg()
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast, storage, fast@fast2"})
    assert [(s.network.name, s.ifname) for s in sel] == [
        ("podnet", "eth0"),
        ("fast", "net1"),
        ("storage", "stor0"),
        ("fast", "fast2"),
    ]


def test_json_form_with_ips_and_mac():
    cfg = _sel_cfg()
    ann = json.dumps(
        [
            {
                "name": "fast",
                "interface": "f0",
                "ips": ["10.244.9.9/24"],
                "mac": "02:00:00:00:00:01",
                "namespace": "default",
            }
        ]
    )
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": ann})
    assert sel[1].ifname == "f0"
    assert sel[1].capability_args == {"ips": ["10.244.9.9/24"], "mac": "02:00:00:00:00:01"}


@pytest.mark.parametrize(
    "value",
    [
        "admin",  # allowed only in kube-system
        "nosuchnet",
        "../etc",
        "/etc/cni/net.d/x.conflist",
        "fast@eth0/x",
        "fast@" + "x" * 16,
        "podnet",  # default networks cannot be asked for again
        "fast@eth0",  # clashes with the primary's interface
        "other/fast",  # another namespace
        '[{"name": "fast", "ips": ["not-an-ip"]}]',
        '[{"name": "fast", "mac": "zz"}]',
        '[{"name": "fast", "cni-args": {"a": "b"}}]',
        '{"name": "fast"}',
        "[not json",
        ",".join(["fast"] * 40),
    ],
)
def test_untrusted_annotations_are_refused(value):
    with pytest.raises(AnnotationRefused):
        select_networks(_sel_cfg(), "default", {"k8s.v1.cni.cncf.io/networks": value})


def test_secondary_mode_leaves_eth0_to_the_runtime():
    cfg = _sel_cfg("secondary")
    theirs = mode_for(cfg).primary
    assert theirs == PrimaryNetwork("cbr0", ours=False)
    sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast"}, primary=theirs)
    assert [(s.network.name, s.ifname) for s in sel] == [("podnet", "net1"), ("fast", "net2")]
    with pytest.raises(AnnotationRefused):
        select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast@eth0"}, primary=theirs)


def test_primary_network_comes_first_as_eth0_in_every_mode_that_owns_it():
    nets = [
        bridge_net("podnet", default=True),
        bridge_net("pods2", default=True),
        bridge_net("fast", namespaces=["*"]),
    ]
    for mode in ("native", "shim"):
        cfg = parse_networks(nets, mode=mode, primary_network="pods2")
        primary = mode_for(cfg).primary
        assert primary == PrimaryNetwork("pods2", ours=True)
        sel = select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast"}, primary=primary)
        assert [(s.network.name, s.ifname) for s in sel] == [
            ("pods2", "eth0"),
            ("podnet", "net1"),
            ("fast", "net2"),
        ]
        # without primary_network: the first default network
        cfg = parse_networks(nets, mode=mode)
        sel = select_networks(cfg, "default", {}, primary=mode_for(cfg).primary)
        assert [(s.network.name, s.ifname) for s in sel] == [("podnet", "eth0"), ("pods2", "net1")]
