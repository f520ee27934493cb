"""Verify and repair without root: the config keys, how a repair asks for its IPs, and which
addresses the cache says another pod holds (the real rounds are in tests/integration/pod/test_verify_repair.py)."""

from __future__ import annotations

import pytest
import yaml

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import parse_config
from nri_cni.errors import ConfigError
from nri_cni.pod.attach import ask_for_ips
from nri_cni.pod.repair import ip_holders, repair_selection, result_ips


def _doc(**extra) -> dict:
    return {
        "networks": [
            {
                "name": "podnet",
                "default": True,
                "conflist": {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "bridge"}]},
            }
        ],
        **extra,
    }


def test_verify_and_repair_defaults():
    cfg = parse_config(_doc())
    assert (cfg.verify_interval, cfg.verify_check_every, cfg.repair) == (30.0, 10, "on")


@pytest.mark.parametrize(
    ("text", "want"), [("on", "on"), ("off", "off"), ("verify-only", "verify-only"), ('"off"', "off")]
)
def test_repair_reads_yaml_words_and_booleans(text, want):
    # unquoted on/off are YAML 1.1 booleans: they still mean the words
    doc = _doc(**yaml.safe_load(f"repair: {text}"))
    assert parse_config(doc).repair == want


def test_verify_section_and_bad_values_are_located():
    cfg = parse_config(_doc(verify={"interval": "5s", "check_every": 3}))
    assert (cfg.verify_interval, cfg.verify_check_every) == (5.0, 3)
    with pytest.raises(ConfigError) as ei:
        parse_config(_doc(verify={"interval": "soon", "check_every": 0, "every": 1}, repair="sometimes"))
    text = str(ei.value)
    for where in ("verify.interval", "verify.check_every", "verify.every", "repair"):
        assert where in text, text


def test_ask_for_ips_sets_cni_args_ip_and_the_ips_capability_once():
    args = [("K8S_POD_NAME", "a"), ("IP", "10.0.0.9")]
    new_args, caps = ask_for_ips(args, {"portMappings": []}, ["10.0.0.5/24", "fd00::5/64"])
    assert new_args == [("K8S_POD_NAME", "a"), ("IP", "10.0.0.5,fd00::5")]
    assert caps == {"portMappings": [], "ips": ["10.0.0.5/24", "fd00::5/64"]}


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
    cfg = parse_config(_doc())
    from nri_cni.pod.select import Selected

    selected = [Selected(cfg.networks[0], "eth0")]
    eth0 = _entry("pod-a", "eth0", "10.0.0.2/24")
    gone = _entry("pod-a", "net1", "10.9.0.2/24", network="retired")
    out = repair_selection(selected, [eth0, gone], [("podnet", "eth0"), ("retired", "net1")])
    assert [(s.network.name, s.ifname) for s in out] == [("podnet", "eth0"), ("retired", "net1")]
    assert out[0].capability_args == {"portMappings": [1]}  # the runtime's, from the cache
    assert out[0].network.default and out[0].network.conflist.bytes == eth0.config
    assert out[1].network.conflist.name == "retired"
