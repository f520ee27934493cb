"""nri_cni/metrics/endpoint.py: the Prometheus text endpoint on a unix socket and on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nri_cni.config import MetricsServerSettings
from nri_cni.errors import CNIError, NriCniError, PluginRef, PodError, Unavailable
from nri_cni.metrics.endpoint import LATENCY_BUCKETS, Metrics, error_code
from nri_cni.metrics.families import RECENT_WINDOW, _RecentNri
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord

POD = PodInfo(id="a" * 64, name="web", namespace="default", netns="/var/run/netns/cni-1")


def run(coro, timeout: float = 10.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="nm-", dir="/tmp")  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def record(op: str, networks: list[dict], error: NriCniError | None = None, age: float = 0.2) -> OpRecord:
    rec = OpRecord(op, POD, started=time.time() - age, networks=networks)
    if error is not None:
        rec.fail(error)
    return rec


def feed(metrics: Metrics) -> None:
    """A few pod operations as the plan reports them."""
    metrics.observe_operation(
        record(
            "add",
            [
                {"network": "pods", "ifname": "eth0", "op": "add", "ms": 42.5},
                {"network": "lan", "ifname": "net1", "op": "add", "ms": 7.0},
                {"network": "pods", "ifname": "eth0", "op": "finalize", "ms": 3.0},
            ],
        )
    )
    failed = PodError(
        f"pod {POD.label()}: networking failed",
        cause=CNIError(7, "invalid config", ref=PluginRef(network="lan", plugin="macvlan", command="ADD")),
    )
    metrics.observe_operation(
        record(
            "add",
            [
                {"network": "pods", "ifname": "eth0", "op": "add", "ms": 40.0},
                {"network": "pods", "ifname": "eth0", "op": "rollback"},
            ],
            error=failed,
        )
    )
    metrics.observe_operation(record("add", [], error=Unavailable("runtime gone")))
    metrics.observe_operation(
        record(
            "del",
            [
                {"network": "lan", "ifname": "net1", "op": "del", "ms": 120.0},
                {"network": "pods", "ifname": "eth0", "op": "del", "ms": 180.0},
            ],
            age=0.31,
        )
    )
    metrics.observe_gc({"deleted": ["pods/x/eth0", "lan/x/net1"], "errors": []})
    metrics.observe_gc({"deleted": [], "errors": ["GC lan: boom"]})


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict, family: str, sample: str, **labels) -> list[float]:
    return [
        s.value
        for s in fams[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def check_exposition(text: str) -> dict:
    """Parses with the reference parser and checks what it leaves to the writer."""
    assert text.endswith("\n")
    fams = families(text)
    hist = fams["nri_cni_network_operation_duration_seconds"]
    assert hist.type == "histogram"
    series: dict[tuple, list] = {}
    for s in hist.samples:
        if s.name.endswith("_bucket"):
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, []).append((float(s.labels["le"]), s.value))
    for key, buckets in series.items():
        bounds = [b for b, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"buckets not cumulative for {key}"
    return fams


def test_render_after_a_few_operations():
    metrics = Metrics(attachments=lambda: 3)
    feed(metrics)
    fams = check_exposition(metrics.render())
    dur = "nri_cni_network_operation_duration_seconds"
    assert samples(fams, dur, dur + "_count", op="add", network="pods") == [2]
    assert samples(fams, dur, dur + "_sum", op="add", network="pods") == [pytest.approx(0.0825)]
    assert samples(fams, dur, dur + "_bucket", op="add", network="pods", le="0.025") == [0]
    assert samples(fams, dur, dur + "_bucket", op="add", network="pods", le="0.05") == [2]
    assert samples(fams, dur, dur + "_count", op="finalize", network="pods") == [1]
    assert samples(fams, dur, dur + "_count", op="del", network="lan") == [1]
    assert not samples(fams, dur, dur + "_count", op="rollback")  # no timing: not observed
    pod = "nri_cni_pod_operation_duration_seconds"
    assert samples(fams, pod, pod + "_count", op="add") == [3]
    (del_sum,) = samples(fams, pod, pod + "_sum", op="del")
    assert 0.31 <= del_sum < 5
    ops = "nri_cni_pod_operations"
    assert samples(fams, ops, ops + "_total", op="add", result="ok") == [1]
    assert samples(fams, ops, ops + "_total", op="add", result="error") == [2]
    assert samples(fams, ops, ops + "_total", op="del", result="ok") == [1]
    fail = "nri_cni_pod_operation_failures"
    assert samples(fams, fail, fail + "_total", op="add", code="7") == [1]
    assert samples(fams, fail, fail + "_total", op="add", code="11") == [1]
    rb = "nri_cni_network_rollbacks"
    assert samples(fams, rb, rb + "_total", network="pods") == [1]
    assert samples(fams, "nri_cni_gc_runs", "nri_cni_gc_runs_total") == [2]
    assert samples(fams, "nri_cni_gc_deleted_attachments", "nri_cni_gc_deleted_attachments_total") == [2]
    assert samples(fams, "nri_cni_gc_errors", "nri_cni_gc_errors_total") == [1]
    assert fams["nri_cni_attachments"].type == "gauge"
    assert samples(fams, "nri_cni_attachments", "nri_cni_attachments") == [3]


def test_fresh_metrics_have_zero_counters_and_no_series():
    fams = check_exposition(Metrics().render())
    assert "nri_cni_attachments" not in fams  # no callable given
    assert samples(fams, "nri_cni_gc_runs", "nri_cni_gc_runs_total") == [0]
    assert fams["nri_cni_pod_operation_duration_seconds"].samples == []


def test_attachments_gauge_is_read_on_every_scrape_and_survives_errors():
    held = [1]

    def count() -> int:
        if held[0] < 0:
            raise OSError("cache dir unreadable")
        return held[0]

    metrics = Metrics(attachments=count)
    assert samples(families(metrics.render()), "nri_cni_attachments", "nri_cni_attachments") == [1]
    held[0] = 5
    assert samples(families(metrics.render()), "nri_cni_attachments", "nri_cni_attachments") == [5]
    held[0] = -1
    fams = families(metrics.render())
    assert "nri_cni_attachments" not in fams and "nri_cni_gc_runs" in fams


def test_label_values_are_escaped():
    metrics = Metrics()
    metrics.observe_operation(record("add", [{"network": 'we"ird\\net\nx', "op": "add", "ms": 1.0}]))
    fams = check_exposition(metrics.render())
    dur = "nri_cni_network_operation_duration_seconds"
    assert samples(fams, dur, dur + "_count", network='we"ird\\net\nx') == [1]


def test_error_code():
    # the code of the first error object, whatever the messages say
    rec = record("add", [], error=Unavailable("x: y (CNI code 7)"))
    rec.fail(CNIError(7, "second"))
    assert error_code(rec) == "11"
    assert error_code(record("add", [], error=NriCniError("refused"))) == "999"
    assert error_code(record("add", [])) == "unknown"
    assert LATENCY_BUCKETS == tuple(sorted(LATENCY_BUCKETS))


async def http(reader_writer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await reader_writer
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    assert lines[0].startswith("HTTP/1.1 ")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


GET = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"


def test_serve_on_a_unix_socket(sock_dir):
    path = os.path.join(sock_dir, "metrics.sock")

    async def scenario():
        metrics = Metrics(attachments=lambda: 2)
        feed(metrics)
        await metrics.serve(path)
        try:
            assert oct(os.stat(path).st_mode & 0o777) == "0o660"
            status, headers, body = await http(asyncio.open_unix_connection(path), GET)
            assert status == 200
            assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert int(headers["content-length"]) == len(body)
            fams = check_exposition(body.decode())
            assert samples(fams, "nri_cni_attachments", "nri_cni_attachments") == [2]
            status, headers, body = await http(
                asyncio.open_unix_connection(path), b"HEAD /metrics HTTP/1.1\r\n\r\n"
            )
            assert status == 200 and body == b"" and int(headers["content-length"]) > 0
            status, _, _ = await http(asyncio.open_unix_connection(path), b"GET / HTTP/1.1\r\n\r\n")
            assert status == 404
            status, headers, _ = await http(
                asyncio.open_unix_connection(path), b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
            )
            assert status == 405 and headers["allow"] == "GET, HEAD"
            status, _, _ = await http(asyncio.open_unix_connection(path), b"hello\r\n\r\n")
            assert status == 400
        finally:
            await metrics.close()
        assert not os.path.exists(path)

    run(scenario())


def test_serve_replaces_a_stale_socket_but_not_a_file(sock_dir):
    path = os.path.join(sock_dir, "metrics.sock")

    async def scenario():
        first = Metrics()
        await first.serve(path)
        first._socket_paths.clear()  # a crashed daemon: its socket file stays behind
        for server in first._servers:
            server.close()
        assert os.path.exists(path)
        second = Metrics()
        await second.serve(path)
        status, _, _ = await http(asyncio.open_unix_connection(path), GET)
        assert status == 200
        await second.close()
        with open(path, "w") as f:
            f.write("not a socket")
        with pytest.raises(OSError):
            await Metrics().serve(path)
        assert open(path).read() == "not a socket"

    run(scenario())


def test_serve_on_localhost_tcp():
    async def scenario():
        metrics = Metrics(attachments=lambda: 0)
        feed(metrics)
        # an idle client may hold its connection for an hour: only closing it ends it
        server = await metrics.serve("127.0.0.1:0", MetricsServerSettings(timeout=3600))
        host, port = server.sockets[0].getsockname()[:2]
        assert host == "127.0.0.1"
        try:
            status, _, body = await http(asyncio.open_connection("127.0.0.1", port), GET)
            assert status == 200
            fams = check_exposition(body.decode())
            fail = "nri_cni_pod_operation_failures"
            assert samples(fams, fail, fail + "_total", op="add", code="7") == [1]
            # A client that connects and says nothing does not block the next one.
            idle = await asyncio.open_connection("127.0.0.1", port)
            status, _, _ = await http(asyncio.open_connection("127.0.0.1", port), GET)
            assert status == 200
        finally:
            await metrics.close()  # the idle client does not hold up the stop (else: run's deadline)
        assert await idle[0].read() == b""  # it was disconnected
        idle[1].close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    run(scenario(), timeout=60)


# The families dashboards read (the names stay when the exposition moves to
# prometheus_client).
STABLE_FAMILIES = {
    "nri_cni_build_info": "gauge",
    "nri_cni_start_time_seconds": "gauge",
    "nri_cni_attachments": "gauge",
    "nri_cni_pod_operation_duration_seconds": "histogram",
    "nri_cni_network_operation_duration_seconds": "histogram",
    "nri_cni_pod_operations": "counter",
    "nri_cni_pod_operation_failures": "counter",
    "nri_cni_network_rollbacks": "counter",
    "nri_cni_gc_runs": "counter",
    "nri_cni_gc_deleted_attachments": "counter",
    "nri_cni_gc_errors": "counter",
    "nri_cni_pod_repairs": "counter",
    # values left out of a container's adjustment at NRI CreateContainer, by reason
    "nri_cni_container_refusals": "counter",
    # what the runtime waits for: per NRI method, per shim verb, per plugin and verb
    "nri_cni_nri_request_duration_seconds": "histogram",
    "nri_cni_shim_request_duration_seconds": "histogram",
    "nri_cni_plugin_duration_seconds": "histogram",
    "nri_cni_nri_request_slowest_recent_seconds": "gauge",
    "nri_cni_nri_request_timeout_seconds": "gauge",
}


def test_the_exposition_is_prometheus_clients_with_the_stable_names():
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    metrics = Metrics(attachments=lambda: 2)
    feed(metrics)
    assert isinstance(metrics.registry, CollectorRegistry)
    text = metrics.render()
    assert text == generate_latest(metrics.registry).decode()
    fams = families(text)
    assert {name: f.type for name, f in fams.items()} == STABLE_FAMILIES
    assert "_created" not in text  # no series the hand-written exposition did not have
    # per network and verb: a histogram of ADD, FINALIZE and DEL time
    dur = "nri_cni_network_operation_duration_seconds"
    verbs = {(s.labels["op"], s.labels["network"]) for s in fams[dur].samples if s.name == dur + "_count"}
    assert verbs == {("add", "pods"), ("add", "lan"), ("finalize", "pods"), ("del", "lan"), ("del", "pods")}


def test_request_latency_labels_stay_bounded_and_the_slowest_recent_answer_is_kept():
    """A shim verb or an NRI method is a label only when known: the shim's CNI_COMMAND comes
    from whoever runs it, and a label must never grow with input."""
    m = Metrics()
    m.observe_shim_request("ADD", 0.02)
    m.observe_shim_request('EVIL"\nverb', 0.01)
    m.observe_nri_request("RunPodSandbox", 0.3, 2.0)
    m.observe_nri_request("NoSuchMethod", 0.1, 2.0)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.render())
        for s in fam.samples
    }
    shim = "nri_cni_shim_request_duration_seconds_count"
    assert samples[(shim, (("verb", "ADD"),))] == 1 and samples[(shim, (("verb", "other"),))] == 1
    nri = "nri_cni_nri_request_duration_seconds_count"
    assert samples[(nri, (("method", "RunPodSandbox"),))] == 1 and samples[(nri, (("method", "other"),))] == 1
    assert samples[("nri_cni_nri_request_slowest_recent_seconds", ())] == 0.3
    assert samples[("nri_cni_nri_request_timeout_seconds", ())] == 2.0


def test_the_slowest_recent_answer_keeps_a_few_answers_however_many_come():
    """Of the NRI answers, only those no later answer is as slow as are kept, and none older
    than the window. Control: answers each faster than the one before are each the slowest
    from their time on, and all kept (within RECENT_KEPT)."""
    now = [0.0]
    recent = _RecentNri(clock=lambda: now[0])
    for i in range(1000):
        now[0] = i * 0.1
        recent.add(0.02 if i % 2 else 0.01)
    assert (len(recent.answers), recent.slowest()) == (1, 0.02)
    falling = _RecentNri(clock=lambda: now[0])
    for i in range(1000):
        falling.add(1.0 - i / 1000)
    assert (len(falling.answers), falling.slowest()) == (1000, 1.0)


def test_the_slowest_recent_answer_is_of_the_window_only():
    now = [0.0]
    recent = _RecentNri(clock=lambda: now[0])
    recent.add(0.5)
    now[0] = 200.0
    recent.add(0.1)
    now[0] = RECENT_WINDOW
    assert recent.slowest() == 0.5  # control: the slow one still in the window
    now[0] = RECENT_WINDOW + 1
    assert recent.slowest() == 0.1
    now[0] = 200.0 + RECENT_WINDOW + 1
    assert (recent.slowest(), len(recent.answers)) == (0.0, 0)
