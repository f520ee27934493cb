"""`nri-cni status` and `nri-cni pods` against a running daemon, as an admin runs them."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run

pytestmark = pytest.mark.netns


async def _cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nri_cni.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode, out.decode()


def test_status_and_pods_tables_and_json(node):
    ns = node.jan.netns()
    nets = [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.37.0/24")}]
    cfg = node.config("native", nets)
    pod = pod_message(new_pod_id(), ns.path, name="web", namespace="default")
    sock = cfg["daemon"]["socket"]

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            resp = await h.runtime.run_pod_sandbox(pod)
            code, status = await _cli("status", "--socket", sock)
            assert code == 0, status
            assert "ready:      yes" in status and "network podnet: ready" in status
            assert "nri-test-double" in status
            code, table = await _cli("pods", "--socket", sock)
            assert code == 0
            row = [ln for ln in table.splitlines() if ln.startswith("default/web")]
            assert row and "podnet" in row[0] and "eth0" in row[0]
            assert f" {resp.adjust.network.ips[0]} " in row[0]
            code, raw = await _cli("pods", "--socket", sock, "-o", "json")
            data = json.loads(raw)
            assert data[0]["id"] == pod.id and data[0]["network-status"][0]["interface"] == "eth0"
            await h.runtime.stop_pod_sandbox(pod)
            await h.runtime.remove_pod_sandbox(pod)
        # daemon gone: not ready for a probe (exit 2), and a message on stderr
        code, out = await _cli("status", "--socket", sock)
        assert code == 2 and "not reachable" in out

    run(scenario())
