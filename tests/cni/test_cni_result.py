"""Result parsing and conversion, against golden JSON written from libcni's conversion rules."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_cni.cni.result import parse_result
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
    assert (eth0.name, eth0.mtu, eth0.pci_id, eth0.socket_path) == ("eth0", 1450, "0000:00:1f.6",
                                                                    "/run/nct-vhost.sock")
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


@pytest.mark.parametrize("bad", [
    b"not json", b"[1]", {"cniVersion": "1.0.0", "ips": {}},
    {"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.5"}]},
    {"cniVersion": "1.0.0", "ips": [{"address": "300.1.1.1/24"}]},
    {"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.5/24", "gateway": "x"}]},
    {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": "1500"}]},
    {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "metadata": {"a": 1}}]},
    {"cniVersion": "1.0.0", "routes": [{"dst": "default"}]},
    {"cniVersion": "0.2.0", "ip4": "10.0.0.1/8"},
    {"cniVersion": "1.0.0", "dns": {"nameservers": "10.0.0.1"}},
])
def test_malformed_results(bad):
    with pytest.raises(CNIError) as err:
        parse_result(bad)
    assert err.value.code == CniCode.DECODING_FAILURE


def test_unknown_version():
    with pytest.raises(CNIError) as err:
        parse_result({"cniVersion": "9.9.9"})
    assert err.value.code == CniCode.INCOMPATIBLE_VERSION


def test_down_to_020_needs_an_address():
    res = parse_result({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]})
    with pytest.raises(CNIError, match="no IP addresses"):
        res.to_dict("0.2.0")
    assert res.to_dict("0.4.0") == {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}], "dns": {}}
