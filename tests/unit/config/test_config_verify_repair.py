"""The verify and repair keys of the config: their defaults, `repair` read as its words even
when YAML 1.1 makes on/off booleans, and bad values located by key."""

from __future__ import annotations

import pytest
import yaml

from nri_cni.config import parse_config
from nri_cni.errors import ConfigError
from tests.support.configdocs import podnet_doc


def test_verify_and_repair_defaults():
    cfg = parse_config(podnet_doc())
    assert (cfg.verify_interval, cfg.verify_check_every, cfg.repair) == (30.0, 10, "on")


@pytest.mark.parametrize(
    ("text", "want"), [("on", "on"), ("off", "off"), ("verify-only", "verify-only"), ('"off"', "off")]
)
def test_repair_reads_yaml_words_and_booleans(text, want):
    # unquoted on/off are YAML 1.1 booleans: they still mean the words
    doc = podnet_doc(**yaml.safe_load(f"repair: {text}"))
    assert parse_config(doc).repair == want


def test_verify_section_and_bad_values_are_located():
    cfg = parse_config(podnet_doc(verify={"interval": "5s", "check_every": 3}))
    assert (cfg.verify_interval, cfg.verify_check_every) == (5.0, 3)
    with pytest.raises(ConfigError) as ei:
        parse_config(
            podnet_doc(verify={"interval": "soon", "check_every": 0, "every": 1}, repair="sometimes")
        )
    text = str(ei.value)
    for where in ("verify.interval", "verify.check_every", "verify.every", "repair"):
        assert where in text, text
