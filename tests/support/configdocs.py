"""Small nri-cni config documents the unit tests parse: one bridge network named as asked, one
default `podnet`, a parsed config of a mode with its state under a test's tmp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nri_cni.config import Config, parse_config

BRIDGE = {
    "cniVersion": "1.1.0",
    "name": "podnet",
    "plugins": [{"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}}],
}
PODNET = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "bridge"}]}


def bridge_net(name: str, **keys: Any) -> dict[str, Any]:
    """A network entry `name` whose inline list is BRIDGE under that name."""
    return {"name": name, "conflist": dict(BRIDGE, name=name), **keys}


def parse_networks(networks: list[dict[str, Any]], **extra: Any) -> Config:
    """The config of just these networks (and `extra` sections), at the default path."""
    return parse_config({"networks": networks, **extra}, "/etc/nri-cni/config.yaml")


def podnet_doc(**extra: Any) -> dict[str, Any]:
    """A document with one default network, podnet (and `extra` sections)."""
    return {"networks": [{"name": "podnet", "default": True, "conflist": PODNET}], **extra}


def mode_config(tmp_path: Path, mode: str, **extra: Any) -> Config:
    """The parsed config of `mode` over podnet, state under `tmp_path`, GC and status timers off."""
    doc = {
        "mode": mode,
        "state_dir": str(tmp_path / "state"),
        "nri": {"socket": str(tmp_path / "nri.sock")},
        "daemon": {"socket": str(tmp_path / "daemon.sock")},
        "cni": {"cache_dir": str(tmp_path / "cache"), "runtime_cache_dir": str(tmp_path / "runtime")},
        "networks": [{"name": "podnet", "default": True, "conflist": PODNET}],
        "gc": {"interval": 0},
        "status": {"interval": 0},
        **extra,
    }
    return parse_config(doc, str(tmp_path / "config.yaml"))
