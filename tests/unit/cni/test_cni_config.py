"""Conflist parsing, validation, version negotiation and conf-dir loading."""

from __future__ import annotations

import json

import pytest

from nri_cni.cni.config import (
    load_conf_dir,
    load_conflist_file,
    load_finalize_dropins,
    parse_conflist,
    validate_container_id,
    validate_ifname,
    validate_network_name,
)
from nri_cni.errors import ConfigError


def conflist(**keys) -> dict:
    base = {"name": "net1", "cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}
    base.update(keys)
    return base


def test_parse_keeps_exact_bytes_and_fields():
    data = b'{"name":"net1", "cniVersion":"0.4.0",\n "plugins":[{"type":"bridge","capabilities":{"portMappings":true,"ips":false}}]}'
    net = parse_conflist(data, "inline:x")
    assert net.bytes == data
    assert net.name == "net1" and net.cni_version == "0.4.0" and net.source == "inline:x"
    assert [p.type for p in net.plugins] == ["bridge"]
    assert net.plugins[0].capabilities == {"portMappings": True, "ips": False}
    assert net.raw["plugins"][0]["type"] == "bridge"
    assert not net.disable_check and not net.disable_gc


@pytest.mark.parametrize(
    "declared,listed,expected",
    [
        ("1.0.0", ["0.4.0", "1.1.0", "2.0.0"], "1.1.0"),  # above 1.1.0 skipped, highest kept
        ("1.2.0", ["0.4.0", "1.0.0"], "1.0.0"),  # unsupported cniVersion ignored when a list helps
        ("0.3.1", [], "0.3.1"),
        ("", [], "0.1.0"),  # nothing declared: the original spec
        ("0.4.0", ["0.3.0"], "0.4.0"),
    ],
)
def test_version_negotiation(declared, listed, expected):
    obj = conflist(cniVersion=declared, cniVersions=listed)
    assert parse_conflist(obj).cni_version == expected


@pytest.mark.parametrize(
    "declared,listed", [("1.2.0", []), ("2.0.0", ["3.0.0"]), ("1.x", []), ("1.0.0", ["a.b.c"])]
)
def test_version_negotiation_refuses(declared, listed):
    with pytest.raises(ConfigError, match="version"):
        parse_conflist(conflist(cniVersion=declared, cniVersions=listed), "inline:v")


@pytest.mark.parametrize(
    "value,expected", [(True, True), (False, False), ("true", True), ("False", False), ("TRUE", True)]
)
def test_booleans_as_bool_or_string(value, expected):
    net = parse_conflist(conflist(disableCheck=value, disableGC=value))
    assert net.disable_check is expected and net.disable_gc is expected


@pytest.mark.parametrize("value", ["yes", 1, None, "1"])
def test_bad_booleans_refused(value):
    with pytest.raises(ConfigError, match="disableCheck"):
        parse_conflist(conflist(disableCheck=value))


@pytest.mark.parametrize("ptype", ["../../bin/sh", "/bin/sh", "sub/bridge", "..", ".", "a..b", ""])
def test_plugin_type_must_be_bare_name(ptype):
    with pytest.raises(ConfigError) as err:
        parse_conflist(conflist(plugins=[{"type": ptype}]), "inline:t")
    assert "inline:t" in str(err.value)


@pytest.mark.parametrize(
    "obj,reason",
    [
        ({"cniVersion": "1.0.0", "plugins": [{"type": "x"}]}, "name"),
        (conflist(name="-bad"), "network name"),
        (conflist(name="a/b"), "network name"),
        (conflist(plugins=[]), "no plugins"),
        (conflist(plugins={"type": "x"}), "list"),
        (conflist(plugins=[["x"]]), "not an object"),
        (conflist(plugins=[{"type": "x", "capabilities": {"portMappings": "yes"}}]), "capabilities"),
        (conflist(cniVersions="1.0.0"), "cniVersions"),
        (conflist(loadOnlyInlinedPlugins=True, plugins=None), "plugins"),
    ],
)
def test_invalid_lists(obj, reason):
    if obj.get("plugins", 0) is None:
        del obj["plugins"]
    with pytest.raises(ConfigError, match=reason):
        parse_conflist(obj)


def test_invalid_json_names_source():
    with pytest.raises(ConfigError) as err:
        parse_conflist(b"{nope", "/etc/cni/net.d/10-x.conflist")
    assert err.value.location == "/etc/cni/net.d/10-x.conflist"
    assert "invalid JSON" in str(err.value)


def test_finalize_plugins_parsed():
    net = parse_conflist(conflist(finalize_plugins=[{"type": "fin-a"}, {"type": "fin-b"}]))
    assert [p.type for p in net.finalize_plugins] == ["fin-a", "fin-b"]
    with pytest.raises(ConfigError, match="bare"):
        parse_conflist(conflist(finalize_plugins=[{"type": "../x"}]))


@pytest.mark.parametrize("name", ["eth0", "net1", "a" * 15, "veth-x_1.2"])
def test_ifname_ok(name):
    validate_ifname(name)


@pytest.mark.parametrize("name", ["", "a" * 16, ".", "..", "a/b", "a:b", "a b", "a\tb"])
def test_ifname_refused(name):
    with pytest.raises(ConfigError):
        validate_ifname(name)


def test_ids_and_names():
    validate_container_id("0123abcd-x_y.z")
    validate_network_name("k8s-pod-network")
    for bad in ("", "_x", "a/b", "a b", "a;b"):
        with pytest.raises(ConfigError):
            validate_container_id(bad)
        with pytest.raises(ConfigError):
            validate_network_name(bad)


def write(path, obj) -> None:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def test_load_conf_dir_order_errors_and_wrapping(tmp_path):
    write(tmp_path / "20-b.conflist", conflist(name="b"))
    write(tmp_path / "10-a.conf", {"name": "a", "cniVersion": "0.3.1", "type": "bridge", "bridge": "nct0"})
    write(tmp_path / "15-broken.conflist", "{not json")
    write(tmp_path / "30-bad-type.json", {"name": "c", "cniVersion": "1.0.0", "type": "../x"})
    write(tmp_path / "40-dup.conflist", conflist(name="b"))
    write(tmp_path / "50-ignored.txt", conflist(name="z"))
    (tmp_path / "60-dir.conflist").mkdir()
    nets, errors = load_conf_dir(tmp_path)
    assert [n.name for n in nets] == ["a", "b"]
    assert [n.source for n in nets] == [str(tmp_path / "10-a.conf"), str(tmp_path / "20-b.conflist")]
    assert sorted(e.location for e in errors) == [
        str(tmp_path / n) for n in ("15-broken.conflist", "30-bad-type.json", "40-dup.conflist")
    ]
    single = nets[0]
    assert single.cni_version == "0.3.1"
    assert single.plugins[0].conf["bridge"] == "nct0"
    wrapped = json.loads(single.bytes)
    assert wrapped == {"cniVersion": "0.3.1", "name": "a", "plugins": [single.plugins[0].conf]}


def test_load_conf_dir_missing_dir(tmp_path):
    assert load_conf_dir(tmp_path / "nope") == ([], [])


def test_dropins_appended_unless_inlined_only(tmp_path):
    write(tmp_path / "10-net.conflist", conflist(name="net"))
    (tmp_path / "net").mkdir()
    write(tmp_path / "net" / "20-second.conf", {"type": "portmap", "capabilities": {"portMappings": True}})
    write(tmp_path / "net" / "10-first.conf", {"type": "tuning"})
    write(tmp_path / "net" / "30-skip.json", {"type": "never"})
    net = load_conflist_file(tmp_path / "10-net.conflist")
    assert [p.type for p in net.plugins] == ["bridge", "tuning", "portmap"]
    # the cached bytes hold the whole chain, and reloading them does not append again
    again = parse_conflist(net.bytes)
    assert [p.type for p in again.plugins] == ["bridge", "tuning", "portmap"]
    assert again.load_only_inlined_plugins

    write(tmp_path / "10-net.conflist", conflist(name="net", loadOnlyInlinedPlugins="true"))
    assert [p.type for p in load_conflist_file(tmp_path / "10-net.conflist").plugins] == ["bridge"]


def test_dropins_only_list(tmp_path):
    write(tmp_path / "10-net.conflist", {"name": "net", "cniVersion": "1.0.0"})
    with pytest.raises(ConfigError, match="no plugin"):
        load_conflist_file(tmp_path / "10-net.conflist")
    (tmp_path / "net").mkdir()
    write(tmp_path / "net" / "a.conf", {"type": "bridge"})
    assert [p.type for p in load_conflist_file(tmp_path / "10-net.conflist").plugins] == ["bridge"]
    write(tmp_path / "net" / "b.conf", {"type": "/bin/sh"})
    with pytest.raises(ConfigError, match="bare"):
        load_conflist_file(tmp_path / "10-net.conflist")


def test_finalize_dropins(tmp_path):
    d = tmp_path / "_finalize.d"
    d.mkdir()
    write(d / "20-b.conf", {"type": "fin-b"})
    write(d / "10-a.conf", {"type": "fin-a", "x": 1})
    write(d / "30-bad.conf", {"type": "a/b"})
    plugins, errors = load_finalize_dropins(tmp_path)
    assert [p.type for p in plugins] == ["fin-a", "fin-b"]
    assert [e.location for e in errors] == [str(d / "30-bad.conf")]
    # a `_finalize.d` dir is not a network's drop-in dir
    assert load_conf_dir(tmp_path) == ([], [])
