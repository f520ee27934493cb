"""The daemon serves its metrics when metrics.listen is set: a pod operation, a refused pod and
the GC after Synchronize all show up on the endpoint."""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.errors import RPCError
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run

pytestmark = pytest.mark.netns


async def _scrape(path: str) -> str:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def test_metrics_endpoint_reports_operations_failures_and_gc(node):
    ns = node.jan.netns()
    nets = [{"name": "podnet", "default": True, "conflist": node.bridge_net("podnet", "10.244.36.0/24")}]
    sock = str(node.tmp / "metrics.sock")
    cfg = node.config("native", nets, metrics={"listen": sock})
    good = pod_message(new_pod_id(), ns.path)
    bad = pod_message(new_pod_id(), ns.path, annotations={"k8s.v1.cni.cncf.io/networks": "nope"})

    async def scenario():
        async with DaemonHarness(node, cfg) as h:
            await h.runtime.run_pod_sandbox(good)
            with pytest.raises(RPCError):
                await h.runtime.run_pod_sandbox(bad)
            text = await _scrape(sock)
            await h.runtime.stop_pod_sandbox(good)
            await h.runtime.remove_pod_sandbox(good)
            return text

    text = run(scenario())
    lines = text.splitlines()
    assert any(ln.startswith("nri_cni_gc_runs") and float(ln.split()[-1]) == 1 for ln in lines), text
    assert any('network="podnet"' in ln and "_count" in ln and float(ln.split()[-1]) == 1 for ln in lines), (
        text
    )
    # the refused annotation: an add that failed with CNI code 7 (invalid config)
    assert any("failures" in ln and 'code="7"' in ln for ln in lines), text
    assert any(ln.startswith("nri_cni_attachments") and float(ln.split()[-1]) == 1 for ln in lines), text
