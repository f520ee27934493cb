"""The in-process fake plugin (conftest.fake_plugin, what the runtime tests run on) does what
tests/plugins/fake_plugin.py does as a process: the same output, exit and call log line for the
same config. A difference in either makes the runtime tests judge a plugin nobody runs."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.executor import FakeExecutor
from nri_cni.errors import CNIError
from tests.support.jsonlines import read_json_lines
from tests.unit.cni.conftest import fake_plugin

ENV = {
    "PATH": "/usr/bin:/bin",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": "/x",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "IgnoreUnknown=1",
    "CNI_PATH": "/nowhere",
}
PREV = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]}

CASES = [
    ("ADD", {}),
    ("ADD", {"prevResult": PREV}),
    ("VERSION", {}),
    ("DEL", {}),
    ("ADD", {"fake": {"ADD": {"result": {"cniVersion": "1.1.0"}, "stderr": "note"}}}),
    ("ADD", {"fake": {"ADD": {"error": {"code": 11, "msg": "busy", "details": "later"}}}}),
    ("CHECK", {"fake": {"CHECK": {"print": "not json", "exit": 3}}}),
    ("GC", {"fake": {"GC": {"error": {"code": 7, "msg": "no"}, "exit": 0}}}),
]


def outcome(executor, path: str, command: str, stdin: bytes) -> tuple[str, str]:
    try:
        return "printed", asyncio.run(executor.exec(path, dict(ENV, CNI_COMMAND=command), stdin, 10)).decode()
    except CNIError as e:
        return type(e).__name__, str(e).replace(path, "<plugin>")


@pytest.mark.parametrize("command,conf", CASES)
def test_in_process_and_process_fakes_agree(fake_bin, tmp_path, command, conf):
    seen = {}
    for kind, executor, path in [
        ("process", PluginExecutor(), str(fake_bin / "fake")),
        ("in-process", FakeExecutor({"fake": fake_plugin}), "/fake-bin/fake"),
    ]:
        log = tmp_path / f"{kind}.jsonl"
        stdin = json.dumps({"type": "fake", "cniVersion": "1.1.0", "log": str(log), **conf}).encode()
        result = outcome(executor, path, command, stdin)
        logged = [dict(line, stdin=dict(line["stdin"], log="")) for line in read_json_lines(log)]
        seen[kind] = (result, logged)
    assert seen["in-process"] == seen["process"]
