"""Fixtures for the CNI runtime unit tests: fake plugins in a temp bin dir, a call log."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.plugin_process import ChildRun
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from tests.support.jsonlines import read_json_lines

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
FAKE_NAMES = ("fake", "fake-a", "fake-b", "fake-c", "fake-d")


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A bin dir: the Python fake plugin under FAKE_NAMES, plus the sh plugins by stem."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "fake"
    fake.write_text(f"#!{sys.executable} -IS\n" + (PLUGINS / "fake_plugin.py").read_text())
    fake.chmod(0o755)
    for name in FAKE_NAMES[1:]:
        os.symlink("fake", bindir / name)
    for script in PLUGINS.glob("*.sh"):
        dst = bindir / script.stem
        shutil.copyfile(script, dst)
        dst.chmod(0o755)
    return bindir


class CallLog:
    """The fake plugins' call log: one dict per exec, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def calls(self) -> list[dict]:
        return read_json_lines(self.path)

    def summary(self) -> list[tuple[str, str]]:
        return [(c["command"], c["type"]) for c in self.calls()]

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture
def call_log(tmp_path: Path) -> CallLog:
    return CallLog(tmp_path / "calls.jsonl")


@pytest.fixture
def runtime(fake_bin: Path, tmp_path: Path) -> CNIRuntime:
    return CNIRuntime(
        [str(tmp_path / "empty-bin"), str(fake_bin)],
        cache_dir=str(tmp_path / "cache"),
        exec_timeout=10.0,
        executor=PluginExecutor(),
    )


@pytest.fixture
def make_net(call_log: CallLog):
    """Builds a NetworkConfigList whose plugins log to `call_log`."""

    def make(plugins: list[dict | str], name: str = "testnet", version: str = "1.1.0", **keys):
        objs = [{"type": p} if isinstance(p, str) else dict(p) for p in plugins]
        for obj in objs:
            obj.setdefault("log", str(call_log.path))
        for obj in keys.get("finalize_plugins", []):
            obj.setdefault("log", str(call_log.path))
        return parse_conflist({"name": name, "cniVersion": version, "plugins": objs, **keys}, "inline:test")

    return make


@pytest.fixture
def rt() -> RuntimeConf:
    return RuntimeConf(
        container_id="c0ffee",
        netns="/var/run/netns/nct-test",
        ifname="eth0",
        args=[("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "web-0")],
        capability_args={
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1000},
        },
    )


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The PIDs of the plugins the executor starts, in order, known from the spawn itself (a
    plugin killed at its timeout may not have run a line yet: nothing it writes can be waited
    for)."""
    pids: list[int] = []
    spawn = ChildRun.spawn

    def recording(self: ChildRun, path: str, env: dict[str, str]) -> None:
        spawn(self, path, env)
        pids.append(self.pid)

    monkeypatch.setattr(ChildRun, "spawn", recording)
    return pids
