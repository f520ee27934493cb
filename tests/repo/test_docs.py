"""docs/troubleshooting.md quotes what nri-cni prints: the quotes must stay true."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.config import load_config
from nri_cni.errors import CNIError, NriCniError
from nri_cni.pod.attach import pod_error
from nri_cni.pod.model import PodInfo
from nri_cni.pod.select import select_networks

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "troubleshooting.md").read_text()
DOCS = DOC + (ROOT / "docs" / "deploy.md").read_text()
SOURCE = "\n".join(p.read_text() for p in (ROOT / "nri_cni").rglob("*.py"))
POD = PodInfo(id="f" * 64, name="web", namespace="default", netns="/var/run/netns/cni-1")


def doc_lines() -> set[str]:
    return {line.strip() for line in DOC.splitlines()}


@pytest.mark.parametrize(
    "fragment",
    [
        "nri-cni daemon is not reachable at ",
        "is not reachable at ",
        "failed to find plugin ",
        "killed after ",
        "no answer within ",
        "(the handler goes on)",
        "NRI runtime closed the connection",
        "disconnected from the runtime; pod events wait for the reconnect",
        "registered with the NRI runtime as ",
        "synchronized: the runtime has ",
        "is not ready",
        "the pod is kept and the attachment retried",
        "recovery: rolled back the interrupted ADD of pod ",
        "interrupted ADD(s) at start-up",
        "(GC will retry)",
        "is unreadable",
        "DEL failed for ",
        "networking failed",
        "runtime-supplied plugin config ignored",
    ],
)
def test_quoted_fragment_is_in_the_code(fragment):
    assert fragment in DOCS
    assert fragment in SOURCE


def test_plugin_missing_message(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    runtime = CNIRuntime([str(bindir)], str(tmp_path / "cache"), executor=PluginExecutor())
    net = parse_conflist({"cniVersion": "1.0.0", "name": "lan", "plugins": [{"type": "macvlan"}]})

    async def add():
        await runtime.add(net, RuntimeConf(container_id=POD.id, netns=POD.netns, ifname="net1"))

    with pytest.raises(CNIError) as info:
        asyncio.run(add())
    exc = info.value
    exc.ref = type(exc.ref)(network="lan", plugin=exc.ref.plugin, command="ADD")  # as the plan does
    line = str(pod_error(POD, exc)).replace(str(bindir), "/opt/cni/bin")
    assert line in doc_lines()


def test_annotation_messages():
    cfg = load_config(str(ROOT / "config" / "examples" / "native-multi.yaml"))
    for namespace, value in (
        ("kube-system", "lan"),
        ("default", "other/lan"),
        ("default", '[{"name": "lan", "mtu": 9000}]'),
    ):
        with pytest.raises(NriCniError) as info:
            select_networks(cfg, namespace, {"k8s.v1.cni.cncf.io/networks": value})
        assert str(info.value) in doc_lines()


def test_config_error_messages(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text(
        "mode: shim\ncni:\n  plugin_timout: 30s\nnetworks:\n  - name: pods\n"
        "    default: true\n    conflist:\n      cniVersion: 1.1.0\n      name: podz\n"
        "      plugins: [{type: bridge}]\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "check-config", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.replace(str(bad), "/etc/nri-cni/config.yaml").splitlines()
    assert lines and all(line in doc_lines() for line in lines)
