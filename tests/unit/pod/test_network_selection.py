"""Which networks a pod gets, and under which interface names: the default networks, then the
ones its annotation asks for (names or the JSON form with IPs and MAC); every untrusted request
refused; in secondary mode eth0 is the runtime's, in the modes that own it the primary network
comes first as eth0."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nri_cni.errors import AnnotationRefused
from nri_cni.pod.model import PrimaryNetwork
from nri_cni.pod.select import (
    MAX_ANNOTATION_BYTES,
    MAX_REQUESTED_NETWORKS,
    NETWORKS_ANNOTATION,
    parse_annotation,
    select_networks,
)
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
    with pytest.raises(AnnotationRefused) as info:
        select_networks(cfg, "default", {"k8s.v1.cni.cncf.io/networks": "fast@eth0"}, primary=theirs)
    assert str(info.value) == "k8s.v1.cni.cncf.io/networks: eth0 belongs to the runtime's own network"


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


# --- the annotation's two forms, as a table (parse_annotation is pure) --------------------------

ANN = NETWORKS_ANNOTATION
IPS16 = [f"10.9.0.{i}/24" for i in range(16)]


def _parsed(value: str) -> list[tuple]:
    return [(r.name, r.namespace, r.interface, r.capability_args) for r in parse_annotation(value)]


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", []),
        (" \t ", []),  # control: " fast " below, a name in the same blanks
        (" fast ", [("fast", "", "", {})]),
        ("team-a/fast@f0, b.2", [("fast", "team-a", "f0", {}), ("b.2", "", "", {})]),
        ('[{"name": "fast"}]', [("fast", "", "", {})]),  # JSON: namespace, interface default to ""
        ('[{"name": "fast", "namespace": "", "interface": ""}]', [("fast", "", "", {})]),
        (
            '[{"name": "fast", "namespace": "team-a", "interface": "f0", "ips": [], "mac": "0A:0b:00:00:00:01"}]',
            [("fast", "team-a", "f0", {"ips": [], "mac": "0A:0b:00:00:00:01"})],
        ),
        (json.dumps([{"name": "fast", "ips": IPS16}]), [("fast", "", "", {"ips": IPS16})]),  # control: 17
        ("a" * 253, [("a" * 253, "", "", {})]),  # control: 254 characters are refused
        (",".join(["fast"] * MAX_REQUESTED_NETWORKS), [("fast", "", "", {})] * MAX_REQUESTED_NETWORKS),
        ("[]" + " " * (MAX_ANNOTATION_BYTES - 2), []),  # exactly the limit; control: one byte more
    ],
)
def test_annotation_forms_parse_to_requests(value, expected):
    assert _parsed(value) == expected


@pytest.mark.parametrize(
    "value, says",
    [
        ("a" * 254, f"{ANN}[0]: network name 'aaaa"),
        (",".join(["fast"] * (MAX_REQUESTED_NETWORKS + 1)), f"{ANN} asks for more than 32 networks"),
        ("[]" + " " * (MAX_ANNOTATION_BYTES - 1), f"{ANN} is larger than 65536 bytes"),
        ("fast,,b", f"{ANN}[1]: empty network reference"),
        ("fast@", f"{ANN}[0]: interface name '' is empty (1-15 bytes, no '/', ':', whitespace or control"),
        ("a b/fast", f"{ANN}[0]: namespace 'a b' is not valid (letters, digits, '_', '.', '-'; no path)"),
        ("[not json", f"{ANN} is not valid JSON: "),
        ('[{"name": "fast"}, "fast"]', f"{ANN}[1]: each element must be an object"),
        ("[{}]", f"{ANN}[0]: name, namespace and interface must be strings"),
        ('[{"name": "fast", "namespace": 7}]', f"{ANN}[0]: name, namespace and interface must be strings"),
        ('[{"name": "fast", "interface": 7}]', f"{ANN}[0]: name, namespace and interface must be strings"),
        ('[{"name": "a/b"}]', f"{ANN}[0]: network name 'a/b' is not valid"),
        ('[{"name": "fast", "namespace": "a/b"}]', f"{ANN}[0]: namespace 'a/b' is not valid"),
        ('[{"name": "fast", "interface": "a/b"}]', f"{ANN}[0]: interface name 'a/b' has '/'"),
        ('[{"name": "fast", "mac": 5}]', f"{ANN}[0]: mac '5' is not a MAC address"),
        # a line break after it: `$` would let it through (control: the same MAC without it, above)
        ('[{"name": "fast", "mac": "0A:0b:00:00:00:01\\n"}]', f"{ANN}[0]: mac '0A:0b:00:00:00:01\\n' is not"),
        (
            '[{"name": "fast", "mac": "02:00:00:00:00"}]',
            f"{ANN}[0]: mac '02:00:00:00:00' is not a MAC address",
        ),
        ('[{"name": "fast", "ips": "10.9.0.1/24"}]', f"{ANN}[0]: ips must be a list of at most 16 strings"),
        ('[{"name": "fast", "ips": [1]}]', f"{ANN}[0]: ips must be a list of at most 16 strings"),
        (
            json.dumps([{"name": "fast", "ips": [*IPS16, "10.9.1.1/24"]}]),
            f"{ANN}[0]: ips must be a list of at most 16",
        ),
        ('[{"name": "fast", "ips": ["10.9.0.1/24", "x"]}]', f"{ANN}[0]: 'x' is not an IP address"),
        (
            '[{"name": "fast", "b": 1, "a": 2}]',
            f"{ANN}[0]: unsupported key(s) a, b (supported: interface, ips, mac, name, namespace)",
        ),
    ],
)
def test_refused_annotations_say_which_element_and_why(value, says):
    """Each refusal names the annotation, the element and what is wrong with it: the pod's owner
    reads it in the pod's events. Control cases: test_annotation_forms_parse_to_requests (the
    same forms with the one part valid)."""
    with pytest.raises(AnnotationRefused) as info:
        parse_annotation(value)
    assert str(info.value).startswith(says)


# --- what select_networks makes of them -------------------------------------------------------


def _pairs(sel) -> list[tuple[str, str]]:
    return [(s.network.name, s.ifname) for s in sel]


def _two_defaults(**pods2):
    return parse_networks(
        [
            bridge_net("podnet", default=True),
            bridge_net("pods2", default=True, **pods2),
            bridge_net("fast", namespaces=["*"]),
        ],
        mode="native",
    )


@pytest.mark.parametrize(
    "primary, pods2, expected",
    [
        (PrimaryNetwork("", ours=True), {}, [("podnet", "eth0"), ("pods2", "net1")]),
        (PrimaryNetwork("pods2", ours=True), {}, [("pods2", "eth0"), ("podnet", "net1")]),
        # control of the one above: only `ours` differs, and the runtime's network is left out
        (PrimaryNetwork("pods2", ours=False), {}, [("podnet", "net1")]),
        (PrimaryNetwork("", ours=False), {}, [("podnet", "net1"), ("pods2", "net2")]),
        # the runtime's network first among the defaults: the ones after it are still ours
        (PrimaryNetwork("podnet", ours=False), {}, [("pods2", "net1")]),
        # the admin named the primary's interface: it keeps it, and eth0 is nobody's
        (PrimaryNetwork("pods2", ours=True), {"interface": "p0"}, [("pods2", "p0"), ("podnet", "net1")]),
    ],
)
def test_the_primary_network_first_as_eth0_when_it_is_ours(primary, pods2, expected):
    assert _pairs(select_networks(_two_defaults(**pods2), "default", {}, primary=primary)) == expected


def test_with_the_runtime_s_network_the_only_default_a_pod_may_get_none():
    """Secondary mode over a default network that is the runtime's own: nothing asked for,
    nothing selected. Control case: one request, which is then net1."""
    cfg = parse_networks(
        [bridge_net("podnet", default=True), bridge_net("fast", namespaces=["*"])], mode="native"
    )
    theirs = PrimaryNetwork("podnet", ours=False)
    assert select_networks(cfg, "default", {}, primary=theirs) == []
    assert _pairs(select_networks(cfg, "default", {ANN: "fast"}, primary=theirs)) == [("fast", "net1")]


def test_a_default_network_is_not_asked_for_again():
    """Even where its namespaces would allow it. Control case: the same request for a network
    that is not a default one."""
    cfg = parse_networks(
        [bridge_net("podnet", default=True, namespaces=["*"]), bridge_net("fast", namespaces=["*"])],
        mode="native",
    )
    assert _pairs(select_networks(cfg, "default", {ANN: "fast"})) == [("podnet", "eth0"), ("fast", "net1")]
    with pytest.raises(AnnotationRefused) as info:
        select_networks(cfg, "default", {ANN: "fast, podnet"})
    assert str(info.value) == f"{ANN}[1]: network 'podnet' is attached to every pod already"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("fast", [("podnet", "eth0"), ("fast", "net1")]),
        # net1 is taken by name: the unnamed one skips it (control: the row above)
        ("fast@net1, fast", [("podnet", "eth0"), ("fast", "net1"), ("fast", "net2")]),
        ("storage, fast", [("podnet", "eth0"), ("storage", "stor0"), ("fast", "net1")]),
        ("storage@s1", [("podnet", "eth0"), ("storage", "s1")]),  # the pod's name over the config's
    ],
)
def test_interface_names(value, expected):
    assert _pairs(select_networks(_sel_cfg(), "default", {ANN: value})) == expected


@pytest.mark.parametrize(
    "namespace, value, says",
    [
        ("default", "fast@x, storage@x", f"{ANN}: interface 'x' is requested twice"),
        ("default", "other/fast", f"{ANN}[0]: network other/fast is in another namespace"),
        ("default", "admin", f"{ANN}[0]: network 'admin' is not allowed for pods in namespace 'default'"),
        ("default", "nosuchnet", f"{ANN}[0]: network 'nosuchnet' is not allowed for pods in namespace"),
    ],
)
def test_refused_selections_say_why(namespace, value, says):
    """Control cases: test_requests_a_namespace_may_make (the same networks asked for where
    they are allowed)."""
    with pytest.raises(AnnotationRefused) as info:
        select_networks(_sel_cfg(), namespace, {ANN: value})
    assert str(info.value).startswith(says)


@pytest.mark.parametrize(
    "namespace, value, expected",
    [
        ("default", "fast@x, storage", [("podnet", "eth0"), ("fast", "x"), ("storage", "stor0")]),
        ("default", "default/fast", [("podnet", "eth0"), ("fast", "net1")]),
        ("kube-system", "admin", [("podnet", "eth0"), ("admin", "net1")]),
        ("kube-system", "kube-system/admin", [("podnet", "eth0"), ("admin", "net1")]),
    ],
)
def test_requests_a_namespace_may_make(namespace, value, expected):
    assert _pairs(select_networks(_sel_cfg(), namespace, {ANN: value})) == expected


def test_a_nad_is_asked_for_by_its_name_in_its_own_namespace():
    """A network from a NetworkAttachmentDefinition `team-b/mv` is meant by `mv` in team-b.
    Control case: the same annotation in team-a, which has no such NAD, is refused."""
    cfg = _sel_cfg()
    nets = {n.name: n for n in cfg.networks}
    mv = dataclasses.replace(nets["fast"], name="mv-net", nad="team-b/mv", namespaces=("team-b",))
    cfg = dataclasses.replace(cfg, networks=(*cfg.networks, mv))
    assert _pairs(select_networks(cfg, "team-b", {ANN: "mv"})) == [("podnet", "eth0"), ("mv-net", "net1")]
    with pytest.raises(AnnotationRefused):
        select_networks(cfg, "team-a", {ANN: "mv"})


@pytest.mark.parametrize(
    "limits, value, says",
    [
        ({"networks_per_pod": 3}, "fast, storage", None),
        # control of the row above: one network more
        (
            {"networks_per_pod": 3},
            "fast, storage, fast@f2",
            f"{ANN}: 4 networks for one pod, more than the limit of 3",
        ),
        ({"attachments_per_network": 2}, "fast@f1, fast@f2", None),
        (
            {"attachments_per_network": 2},
            "fast@f1, fast@f2, fast@f3",
            f"{ANN}: network 'fast' attached 3 times",
        ),
    ],
)
def test_the_pod_limits_of_the_config_hold(limits, value, says):
    cfg = parse_networks(
        [
            bridge_net("podnet", default=True),
            bridge_net("fast", namespaces=["*"]),
            bridge_net("storage", namespaces=["*"]),
        ],
        mode="native",
        limits=limits,
    )
    if says is None:
        assert len(select_networks(cfg, "default", {ANN: value})) == 1 + len(value.split(","))
        return
    with pytest.raises(AnnotationRefused) as info:
        select_networks(cfg, "default", {ANN: value})
    assert str(info.value).startswith(says)
