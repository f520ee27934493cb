"""Fixtures for the CNI runtime unit tests: the fake plugin in-process (`runtime`, over a
FakeExecutor) and as processes in a temp bin dir (`fake_bin`, for the tests whose subject is the
process), and the call log both write."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FAKE_BIN, Call, FakeExecutor
from nri_cni.cni.plugin_process import ChildRun
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from tests.support.bin_dir import PLUGINS, install_plugin, install_test_plugin
from tests.support.jsonlines import read_json_lines

FAKE_NAMES = ("fake", "fake-a", "fake-b", "fake-c", "fake-d")


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A bin dir: the Python fake plugin under FAKE_NAMES, plus the sh plugins by stem."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    install_test_plugin(bindir, "fake_plugin", "fake")
    for name in FAKE_NAMES[1:]:
        os.symlink("fake", bindir / name)
    for script in PLUGINS.glob("*.sh"):
        install_plugin(bindir, script.stem, script.read_text())
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


VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


async def fake_plugin(call: Call) -> Ended:
    """What tests/plugins/fake_plugin.py does as a process, in-process (a FakeExecutor answer):
    the same call log line, the same config key "fake", the same default behaviour."""
    conf = call.config()
    log = conf.get("log") or call.env.get("FAKE_LOG")
    if log:
        env = {k: v for k, v in call.env.items() if k.startswith("CNI_") or k == "PATH"}
        line = json.dumps({"type": conf.get("type"), "command": call.command, "env": env, "stdin": conf})
        with open(log, "a") as f:
            f.write(line + "\n")
    act = conf.get("fake", {}).get(call.command)
    if act is None:
        if call.command == "ADD":
            res = conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}
            res.setdefault("interfaces", []).append({"name": conf.get("type")})
            act = {"result": res}
        elif call.command == "VERSION":
            act = {"result": {"cniVersion": "1.1.0", "supportedVersions": VERSIONS}}
        else:
            act = {}
    if "sleep" in act:
        await asyncio.sleep(act["sleep"])
    stdout = act.get("print", "")
    if "result" in act:
        stdout += json.dumps(act["result"])
    if "error" in act:
        stdout += json.dumps(dict(act["error"], cniVersion=conf.get("cniVersion", "1.1.0")))
    status = act.get("exit", 1 if "error" in act else 0)
    return Ended(stdout=stdout.encode(), stderr=act.get("stderr", "").encode(), status=status)


@pytest.fixture
def fake_executor() -> FakeExecutor:
    """The fake plugin in-process under FAKE_NAMES."""
    return FakeExecutor(dict.fromkeys(FAKE_NAMES, fake_plugin))


@pytest.fixture
def runtime(fake_executor: FakeExecutor, tmp_path: Path) -> CNIRuntime:
    """The runtime over the in-process fake plugins: what a chain is given, in which order,
    and the cache need no process (tests/unit/cni/test_cni_exec.py runs real ones)."""
    return CNIRuntime(
        [str(tmp_path / "empty-bin"), FAKE_BIN],
        cache_dir=str(tmp_path / "cache"),
        exec_timeout=10.0,
        executor=fake_executor,
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
