"""What the runtime waits for, on the metrics endpoint, after one pod's ADD and DEL through real
containerd in shim mode: the NRI requests per method, the shim's CNI verbs, each plugin's calls
by type and verb, and the slowest recent NRI answer beside the runtime's deadline."""

from __future__ import annotations

import re
import socket
import uuid

import pytest

pytestmark = pytest.mark.e2e


def _scrape(path: str) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def _value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels}` (labels in any order, no others); 0 when absent."""
    for line in text.splitlines():
        m = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == labels:
            return float(m.group(3))
    return 0.0


def test_nri_shim_and_plugin_latency_after_a_pods_add_and_del(shim_node):
    node = shim_node
    sock = str(node.setup.sock_dir / "metrics.sock")
    node.start(node.networks()[:1], metrics={"listen": sock})
    ctd = node.ctd
    pod = ctd.cri.run_pod(f"lat-{uuid.uuid4().hex[:6]}", "nct-e2e", str(uuid.uuid4()))
    node.leaks.add_markers(pod, ctd.cri.pod_status(pod).ip)
    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)
    text = _scrape(sock)

    count = "nri_cni_nri_request_duration_seconds_count"
    for method in ("Configure", "Synchronize", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"):
        assert _value(text, count, method=method) >= 1, (method, text)
    assert _value(text, "nri_cni_shim_request_duration_seconds_count", verb="ADD") == 1, text
    assert _value(text, "nri_cni_shim_request_duration_seconds_count", verb="DEL") >= 1, text
    for plugin in ("bridge", "portmap"):
        assert _value(text, "nri_cni_plugin_duration_seconds_count", plugin=plugin, verb="ADD") == 1, text
        assert _value(text, "nri_cni_plugin_duration_seconds_count", plugin=plugin, verb="DEL") >= 1, text
    # a histogram's +Inf bucket holds every answer: the buckets are Prometheus's own
    assert _value(text, "nri_cni_nri_request_duration_seconds_bucket", method="RunPodSandbox", le="+Inf") >= 1
    assert _value(text, "nri_cni_nri_request_slowest_recent_seconds") > 0, text
    assert _value(text, "nri_cni_nri_request_timeout_seconds") > 0, text  # what containerd's Configure said
    assert node.leaks.leaks() == []
