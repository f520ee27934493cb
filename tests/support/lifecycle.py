"""Fixtures for the network lifecycle tests: a bin dir with the lifecycle test plugin
(tests/plugins/lifecycle_plugin.py), the fake plugin, and optionally the real plugins behind a
spy that logs every CNI_COMMAND they are run with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nri_cni.cni.config import NetworkConfigList, parse_conflist
from tests.support.bin_dir import install_plugin, install_test_plugin
from tests.support.jsonlines import read_json_lines

LIFECYCLE_NAMES = ("lifecycle-test", "lifecycle-test2")


def install_lifecycle_plugins(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    install_test_plugin(bin_dir, "lifecycle_plugin", *LIFECYCLE_NAMES)
    if not (bin_dir / "fake-ok").exists():
        install_test_plugin(bin_dir, "fake_plugin", "fake-ok")


def spy_on_real_plugins(bin_dir: Path, log: Path) -> None:
    """Replaces each symlink to a real plugin with a shell wrapper that logs
    "<plugin> <CNI_COMMAND>" to `log`, then execs the real binary."""
    for entry in bin_dir.iterdir():
        if not entry.is_symlink():
            continue
        real = os.path.realpath(entry)
        entry.unlink()
        install_plugin(
            bin_dir,
            entry.name,
            f'#!/bin/sh\necho "{entry.name} $CNI_COMMAND" >> "{log}"\nexec "{real}" "$@"\n',
        )


class Calls:
    """The JSON lines the lifecycle plugin logged."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict]:
        return read_json_lines(self.path)

    def verbs(self, *commands: str, network: str | None = None) -> list[dict]:
        return [
            c for c in self.all() if c["command"] in commands and (network is None or c["name"] == network)
        ]

    def seq(self, network: str | None = None) -> list[tuple[str, str]]:
        """(command, generation) of each INIT/DEINIT, in order."""
        return [(c["command"], c["generation"]) for c in self.verbs("INIT", "DEINIT", network=network)]


class LcWorld:
    """Dirs and config builders for one test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin_dir = tmp / "bin"
        install_lifecycle_plugins(self.bin_dir)
        self.state_dir = tmp / "state"
        self.cache_dir = tmp / "cache"
        self.log = tmp / "lifecycle.log"
        self.fake_log = tmp / "fake.log"
        self.calls = Calls(self.log)

    def plugin(self, name: str = "lifecycle-test", *, verbs=("init", "deinit"), **keys) -> dict:
        conf = {"type": name, "log": str(self.log), "counter": str(self.tmp / "counter"), **keys}
        if verbs is not None:
            conf["cni.dev/lifecycle"] = list(verbs)
        return conf

    def fake(self) -> dict:
        return {"type": "fake-ok", "log": str(self.fake_log)}

    def conflist(self, name: str, *plugins: dict, version: str = "1.1.0") -> dict:
        return {"cniVersion": version, "name": name, "plugins": list(plugins or [self.plugin()])}

    def net(self, name: str, *plugins: dict) -> NetworkConfigList:
        return parse_conflist(self.conflist(name, *plugins), source=f"test:{name}")


@pytest.fixture
def world(tmp_path) -> LcWorld:
    return LcWorld(tmp_path)


# -- a whole node: real plugins (spied on), the daemon, the NRI test double ---------------------


@pytest.fixture
def lnode(tmp_path):
    """The daemon harness's Node (tests/support/harness.py), plus the lifecycle plugins and a spy log of the real plugins' verbs."""
    from tests.support.harness import Node
    from tests.support.janitor import Janitor

    jan = Janitor()
    node = Node(tmp_path, jan)
    install_lifecycle_plugins(node.bin_dir)
    node.spy_log = tmp_path / "real-plugins.log"
    spy_on_real_plugins(node.bin_dir, node.spy_log)
    node.lc = Calls(tmp_path / "lifecycle.log")
    yield node
    jan.cleanup_or_raise()
