"""The config file parsed: every error located (file and key, or line and column) and all of
them reported at once; an inline conflist must carry its network's name and bare plugin types;
defaults and durations; the metrics endpoint listens only on a local address."""

from __future__ import annotations

import pytest

from nri_cni.config import Config, ConfigErrors, load_config_text, parse_config
from nri_cni.errors import ConfigError
from tests.support.configdocs import BRIDGE, bridge_net, parse_networks


def test_config_errors_are_located_and_all_reported():
    doc = {
        "mode": "sideways",
        "nri": {"plugin_index": "7", "socket": "relative/path"},
        "cni": {"plugin_timeout": "soon"},
        "networks": [
            bridge_net("podnet", default=True),
            bridge_net("podnet"),
            {"name": "x", "file": "/nonexistent.conflist"},
            {"name": "bad/name", "conflist": BRIDGE},
        ],
        "colour": "blue",
    }
    with pytest.raises(ConfigErrors) as err:
        parse_config(doc, "/etc/nri-cni/config.yaml")
    text = str(err.value)
    for where in (
        "mode",
        "nri.plugin_index",
        "nri.socket",
        "cni.plugin_timeout",
        "networks[1].name",
        "networks[2].file",
        "networks[3].name",
        "colour",
    ):
        assert f"config.yaml: {where}" in text, (where, text)


def test_yaml_syntax_error_names_line_and_column():
    with pytest.raises(ConfigError) as err:
        load_config_text("mode: shim\nnetworks: [\n", "/x/config.yaml")
    assert "/x/config.yaml:3:1" in str(err.value) or "/x/config.yaml:2" in str(err.value)


def test_inline_conflist_must_match_its_name_and_have_bare_plugin_types():
    with pytest.raises(ConfigError) as err:
        parse_networks(
            [
                {
                    "name": "podnet",
                    "default": True,
                    "conflist": dict(BRIDGE, plugins=[{"type": "../../bin/sh"}]),
                }
            ]
        )
    assert "networks[0].conflist" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_networks([{"name": "other", "default": True, "conflist": BRIDGE}])
    assert "named 'podnet'" in str(err.value)


def test_defaults_and_durations():
    cfg = parse_networks(
        [bridge_net("podnet", default=True)],
        gc={"interval": "2m"},
        nri={"plugin_index": 5, "request_timeout": "1500ms"},
    )
    assert cfg.mode == "shim" and cfg.gc_interval == 120 and cfg.nri.plugin_index == "05"
    assert cfg.nri.request_timeout == 1.5
    assert cfg.primary.name == "podnet"
    assert cfg.cni.cache_dir == "/var/lib/cni/nri-cni"


def test_metrics_listen_only_local():
    with pytest.raises(ConfigError) as err:
        parse_networks([bridge_net("podnet", default=True)], metrics={"listen": "0.0.0.0:9100"})
    assert "metrics.listen" in str(err.value)
    assert parse_networks(
        [bridge_net("podnet", default=True)], metrics={"listen": "127.0.0.1:9100"}
    ).metrics_listen


def test_a_document_without_keys_gets_the_dataclass_defaults():
    """Defaults are stated once, in config/model.py: the parser reads them from there."""
    assert parse_config({}, "<config>") == Config(path="<config>")
    # control: a key given changes the one field it names
    assert parse_config({"verify": {"check_every": 3}}, "<config>") == Config(
        path="<config>", verify_check_every=3
    )
