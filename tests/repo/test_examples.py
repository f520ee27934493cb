"""config/examples/: one config per mode, each accepted by `nri-cni check-config`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nri_cni.config import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
EXPECTED = {
    "shim-bridge.yaml": "shim",
    "native-multi.yaml": "native",
    "secondary.yaml": "secondary",
    "finalize.yaml": "shim",
}


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_examples_are_the_expected_ones():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXPECTED)


def hermetic_copy(name: str, tmp_path: Path) -> Path:
    """The example with its FINALIZE drop-in dir in tmp_path: check-config reads that directory,
    and the node's own /etc/cni/net.d is whatever the machine has (another run may hold it 0700)."""
    cfg = yaml.safe_load((EXAMPLES / name).read_text())
    cfg.setdefault("cni", {})["finalize_dir"] = str(tmp_path / "_finalize.d")
    copy = tmp_path / name
    copy.write_text(yaml.safe_dump(cfg))
    return copy


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_passes_check_config(name, tmp_path):
    copy = hermetic_copy(name, tmp_path)
    run = check_config(copy)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"{copy}: ok ({EXPECTED[name]} mode)"


def test_check_config_fails_on_a_broken_copy(tmp_path):
    """The check above can fail: a typo in a key is refused with its location."""
    text = (EXAMPLES / "shim-bridge.yaml").read_text().replace("plugin_timeout:", "plugin_timout:")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    run = check_config(bad)
    assert run.returncode == 2
    assert f"{bad}: cni.plugin_timout: unknown key" in run.stderr


def test_native_multi():
    cfg = load_config(str(EXAMPLES / "native-multi.yaml"))
    pods, lan = cfg.network("pods"), cfg.network("lan")
    assert cfg.primary is pods and pods.default and pods.interface == "eth0"
    assert not lan.default and lan.interface == "net1"
    assert lan.allowed_in("default") and not lan.allowed_in("kube-system")
    assert [p.type for p in lan.conflist.plugins] == ["macvlan"]


def test_secondary():
    cfg = load_config(str(EXAMPLES / "secondary.yaml"))
    assert cfg.primary_network and cfg.network(cfg.primary_network) is None  # the runtime's own
    assert cfg.networks and not any(n.default for n in cfg.networks)
    assert cfg.cni.finalize_dir.endswith("/_finalize.d")


def test_finalize():
    cfg = load_config(str(EXAMPLES / "finalize.yaml"))
    (net,) = cfg.networks
    assert [p.type for p in net.conflist.finalize_plugins] == ["route-fixup"]
    assert cfg.cni.finalize_dir.endswith("/_finalize.d")
