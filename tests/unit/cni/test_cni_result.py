"""Result parsing and conversion, against golden JSON (golden/results.json, held to real
libcni 1.3.0 by tests/integration/cni/test_libcni_oracle.py; nri-cni keeps what libcni drops)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_cni.cni import result_addr
from nri_cni.cni.result_parse import parse_result
from nri_cni.errors import CniCode, CNIError

GOLDEN = json.loads((Path(__file__).parent / "golden" / "results.json").read_text())
VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")


@pytest.mark.parametrize("version", VERSIONS)
def test_rich_result_converted_down(version):
    res = parse_result(GOLDEN["rich_input"])
    assert res.to_dict(version) == GOLDEN["rich_as"][version]


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip_through_every_version(version):
    """What a version can hold survives parse(to_dict(v)) -> v unchanged."""
    once = parse_result(GOLDEN["rich_input"]).to_dict(version)
    assert parse_result(json.dumps(once).encode()).to_dict(version) == once


@pytest.mark.parametrize("case", GOLDEN["up"], ids=lambda c: c["input"].get("cniVersion", "none"))
def test_old_results_converted_up(case):
    res = parse_result(case["input"])
    assert res.to_dict() == case["as_1.1.0"]


def test_model_fields():
    res = parse_result(GOLDEN["rich_input"])
    assert res.cni_version == "1.1.0"
    eth0 = res.interfaces[1]
    assert (eth0.name, eth0.mtu, eth0.pci_id, eth0.socket_path) == (
        "eth0",
        1450,
        "0000:00:1f.6",
        "/run/nct-vhost.sock",
    )
    assert eth0.metadata == {"vendor": "nct"}
    assert [ip.interface for ip in res.ips] == [1, 1, None]
    assert res.routes[1].table == 100 and res.routes[1].scope == 0 and res.routes[0].scope is None
    assert res.dns.search == ["svc.cluster.local"]
    assert res.extra == {"x-top": "kept"}


def test_version_fallback_when_result_names_none():
    obj = {"ips": [{"address": "10.244.3.4/24"}], "interfaces": [{"name": "eth0", "mtu": 9000}]}
    assert parse_result(obj, "1.0.0").cni_version == "1.0.0"
    assert parse_result(obj, "1.0.0").interfaces[0].mtu == 9000
    # no version anywhere: 0.1.0, where "ips" means nothing
    assert parse_result(obj).cni_version == "0.1.0" and parse_result(obj).ips == []


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"[1]",
        {"cniVersion": "1.0.0", "ips": {}},
        {"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.5"}]},
        {"cniVersion": "1.0.0", "ips": [{"address": "300.1.1.1/24"}]},
        {"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.5/24", "gateway": "x"}]},
        {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": "1500"}]},
        {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "metadata": {"a": 1}}]},
        {"cniVersion": "1.0.0", "routes": [{"dst": "default"}]},
        {"cniVersion": "0.2.0", "ip4": "10.0.0.1/8"},
        {"cniVersion": "1.0.0", "dns": {"nameservers": "10.0.0.1"}},
    ],
)
def test_malformed_results(bad):
    with pytest.raises(CNIError) as err:
        parse_result(bad)
    assert err.value.code == CniCode.DECODING_FAILURE


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"interfaces": ["eth0"]}, "interfaces[0] is not an object"),
        ({"interfaces": [{"name": "eth0"}, {"name": 7}]}, "interfaces[1].name is not a string"),
        ({"interfaces": [{"name": "eth0", "mac": ["a"]}]}, "interfaces[0].mac is not a string"),
        ({"interfaces": [{"name": "eth0", "sandbox": 1}]}, "interfaces[0].sandbox is not a string"),
        ({"interfaces": [{"name": "eth0", "socketPath": False}]}, "interfaces[0].socketPath is not a string"),
        ({"interfaces": [{"name": "eth0", "mtu": True}]}, "interfaces[0].mtu is not an integer"),
        ({"interfaces": [{"name": "eth0", "metadata": ["x"]}]}, "interfaces[0].metadata is not a map"),
        ({"ips": [{"address": "10.0.0.2/24", "interface": "0"}]}, "ips[0].interface is not an integer"),
        ({"ips": [{"address": "10.0.0.2/24", "gateway": 1}]}, "ips[0].gateway is not a string"),
        ({"ips": [{"address": 1}]}, "ips[0].address is not a string"),
        ({"ips": [{}, {"address": "10.0.0.2"}]}, "ips[0].address '' is not an address/prefix"),
    ],
)
def test_malformed_results_name_the_field(bad, where):
    with pytest.raises(CNIError, match=re.escape(where)):
        parse_result({"cniVersion": "1.1.0", **bad})


def test_unknown_version():
    with pytest.raises(CNIError) as err:
        parse_result({"cniVersion": "9.9.9"})
    assert err.value.code == CniCode.INCOMPATIBLE_VERSION


def test_down_to_020_needs_an_address():
    res = parse_result({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]})
    with pytest.raises(CNIError, match="no IP addresses"):
        res.to_dict("0.2.0")
    assert res.to_dict("0.4.0") == {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}], "dns": {}}


_V4_PART = st.sampled_from(["0", "1", "9", "10", "99", "255", "256", "010", "300"])
_V6_PART = st.sampled_from(["0", "1", "ff", "FFFF", "db8", "0000", "a", "10000"])


@st.composite
def _address_text(draw):
    if draw(st.booleans()):
        text = ".".join(draw(st.lists(_V4_PART, min_size=3, max_size=5)))
    else:
        parts = draw(st.lists(_V6_PART, min_size=8, max_size=8))
        i = draw(st.integers(0, 7))
        j = draw(st.integers(i, 8))
        text = ":".join(parts) if i == j else ":".join(parts[:i]) + "::" + ":".join(parts[j:])
        text += draw(st.sampled_from(["", "", "%eth0", ":1.2.3.4"]))
    if draw(st.booleans()):
        text += "/" + draw(
            st.sampled_from(["0", "8", "24", "32", "33", "64", "128", "129", "024", "x", "", "255.255.255.0"])
        )
    return text


@settings(max_examples=2000, deadline=None)
@given(_address_text())
def test_fast_address_canonical_form_matches_ipaddress(text):
    """The C-parser fast path gives exactly what the ipaddress module gives (validity and
    canonical text), for addresses and address/prefix."""
    for with_prefix in (True, False):
        result_addr.canonical.cache_clear()
        fast = result_addr.canonical(text, with_prefix)
        if ("/" in text) != with_prefix:
            assert fast is None
        else:
            assert fast == result_addr.canonical_slow(text, with_prefix)
