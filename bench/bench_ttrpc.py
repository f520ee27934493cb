"""What the NRI transport adds to a RunPodSandbox round trip.

In one run, alternating so that both see the same machine noise: N RunPodSandbox calls from
the runtime double through the real Stub (mux, ttrpc, protobuf both ways; the plugin answers
2 IPs at once) against N round trips of the same request bytes through a bare asyncio echo
server on a unix socket. The difference of the medians is the transport's own cost per call.

Where that difference goes, measured in the same run without a socket: the stub's side (the
request bytes fed to the plugin's mux trunk as the socket would hand them, until its answer is
written: mux, ttrpc frame, protobuf, the handler's task, the answer's encoding) and the runtime
double's side (its call until the request is written, and from the answer's bytes to the
decoded response). What is left is the two sides' socket reads and event loop turns, which an
echo pays once per side and a call twice (the answer runs in a task of its own).

    python bench/bench_ttrpc.py [-n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support

from bench.goals import GOALS
from nri_cni.api import nri_pb2, ttrpc_pb2
from nri_cni.nri import mux, trunk
from nri_cni.nri.plugin_service import PLUGIN_SERVICE, PluginService
from nri_cni.nri.stub import Stub
from nri_cni.ttrpc import TtrpcClient, TtrpcServer
from nri_cni.ttrpc.framing import MessageType, encode_frame
from tests.support.nri_runtime import NriRuntime

ANSWER = nri_pb2.RunPodSandboxResponse(
    adjust=nri_pb2.PodSandboxAdjustment(
        network=nri_pb2.PodSandboxNetwork(ips=["10.244.1.17", "fd00:10:244:1::17"])
    )
)


class Plugin:
    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.RunPodSandboxResponse:
        return ANSWER


def sample_pod() -> nri_pb2.PodSandbox:
    """A pod as containerd sends it: labels, annotations, netns, IPs."""
    return nri_pb2.PodSandbox(
        id="5f0c3a6b9d1e4f2a8c7b6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a",
        name="web-7d9f8b6c5d-x2x4k",
        uid="1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9",
        namespace="default",
        runtime_handler="runc",
        pid=4242,
        ips=["10.88.0.17"],
        labels={"app": "web", "pod-template-hash": "7d9f8b6c5d", "io.kubernetes.pod.namespace": "default"},
        annotations={
            "kubernetes.io/config.source": "api",
            "kubernetes.io/config.seen": "2026-11-21T23:05:00.000000000Z",
        },
        linux=nri_pb2.LinuxPodSandbox(
            cgroup_parent="/kubepods/besteffort/pod1b2c3d4e",
            namespaces=[nri_pb2.LinuxNamespace(type="network", path="/var/run/netns/cni-1b2c3d4e-5f60")],
        ),
    )


class EchoClient(asyncio.Protocol):
    """Sends a blob, resolves when the same number of bytes came back."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._want = 0
        self._got = 0
        self._done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._got += len(data)
        if self._got >= self._want and self._done is not None:
            self._done.set_result(None)

    async def round_trip(self, blob: bytes) -> None:
        self._want, self._got = len(blob), 0
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(blob)  # type: ignore[union-attr]
        await self._done


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


class Sink(asyncio.Transport):
    """A socket's place under a trunk: what is written resolves `written`."""

    def __init__(self) -> None:
        super().__init__()
        self.written: asyncio.Future[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.written is not None and not self.written.done():
            self.written.set_result(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def request_blob(stream_id: int, req: bytes) -> bytes:
    """A RunPodSandbox request as the runtime puts it on the socket (mux, ttrpc frame)."""
    body = ttrpc_pb2.Request(
        service=PLUGIN_SERVICE, method="RunPodSandbox", payload=req, timeout_nano=2_000_000_000
    ).SerializeToString()
    return mux.encode(mux.PLUGIN_SERVICE_CONN, encode_frame(stream_id, MessageType.REQUEST, 0, body))


async def sides(n: int, pod: nri_pb2.PodSandbox) -> tuple[list[float], list[float]]:
    """Each side's own work per call, no socket: (the stub's, the runtime double's)."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    service = PluginService(Plugin(), on_configured=lambda req: None, on_synchronized=lambda: None)
    server = TtrpcServer({PLUGIN_SERVICE: service.handlers()})
    plugin_side, plugin_sink = trunk.Trunk({mux.PLUGIN_SERVICE_CONN: server.protocol()}), Sink()
    plugin_side.connection_made(plugin_sink)
    client = TtrpcClient()
    runtime_side, runtime_sink = trunk.Trunk({mux.PLUGIN_SERVICE_CONN: client}), Sink()
    runtime_side.connection_made(runtime_sink)
    req = nri_pb2.RunPodSandboxRequest(pod=pod).SerializeToString()
    stub_t: list[float] = []
    runtime_t: list[float] = []
    for i in range(n + 200):  # the first 200: warm-up
        blob = request_blob(2 * i + 1, req)
        plugin_sink.written = loop.create_future()
        t0 = clock()
        plugin_side.data_received(blob)
        answer = await plugin_sink.written
        t1 = clock()
        # the runtime double's call as NriRuntime.run_pod_sandbox makes it, answered with the
        # bytes the stub wrote (the client's stream ids follow the same 1, 3, 5...)
        runtime_sink.written = loop.create_future()
        t2 = clock()
        call = loop.create_task(
            client.call(
                PLUGIN_SERVICE, "RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=pod).SerializeToString()
            )
        )
        await runtime_sink.written
        runtime_side.data_received(answer)
        resp = nri_pb2.RunPodSandboxResponse.FromString(await call)
        t4 = clock()
        if i >= 200:
            stub_t.append(t1 - t0)
            runtime_t.append(t4 - t2)
    assert list(resp.adjust.network.ips) == list(ANSWER.adjust.network.ips)
    return stub_t, runtime_t


def summary(name: str, samples: list[float]) -> str:
    median, p90 = statistics.median(samples), statistics.quantiles(samples, n=10)[8]
    return f"{name:<28} median {median * 1e6:7.1f} us   p90 {p90 * 1e6:7.1f} us"


async def bench(n: int) -> dict:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="nct-bench-") as tmp:
        runtime = NriRuntime(f"{tmp}/nri.sock")
        await runtime.start()
        stub = Stub(Plugin(), name="bench", idx="10", socket_path=f"{tmp}/nri.sock")
        stub_task = asyncio.create_task(stub.run())
        echo_server = await loop.create_unix_server(Echo, f"{tmp}/echo.sock")
        echo = EchoClient()
        await loop.create_unix_connection(lambda: echo, f"{tmp}/echo.sock")
        try:
            await runtime.wait_plugin()
            pod = sample_pod()
            req = nri_pb2.RunPodSandboxRequest(pod=pod).SerializeToString()
            blob = request_blob(1, req)
            for _ in range(200):  # warm-up
                await runtime.run_pod_sandbox(pod)
                await echo.round_trip(blob)
            rpc, raw = [], []
            clock = time.perf_counter
            for _ in range(n):
                t0 = clock()
                resp = await runtime.run_pod_sandbox(pod)
                t1 = clock()
                await echo.round_trip(blob)
                t2 = clock()
                rpc.append(t1 - t0)
                raw.append(t2 - t1)
            assert list(resp.adjust.network.ips) == list(ANSWER.adjust.network.ips)
        finally:
            echo.transport.close()  # type: ignore[union-attr]
            echo_server.close()
            await stub.stop()
            await stub_task
            await runtime.stop()
    stub_t, runtime_t = await sides(n, sample_pod())
    print(f"{n} round trips each, request {len(blob)} bytes on the wire")
    print(summary("RunPodSandbox via the stub", rpc))
    print(summary("bare unix-socket echo", raw))
    med_rpc, med_raw = statistics.median(rpc), statistics.median(raw)
    print(
        f"ratio {med_rpc / med_raw:.2f}; added by the transport at the median: "
        f"{(med_rpc - med_raw) * 1e6:.1f} us per request (goal `ttrpc` {GOALS['ttrpc'].text})"
    )
    med_stub, med_runtime = statistics.median(stub_t), statistics.median(runtime_t)
    print(summary("the stub's side, no socket", stub_t))
    print(summary("the runtime double's side", runtime_t))
    left = med_rpc - med_raw - med_stub - med_runtime
    print(
        f"of the {(med_rpc - med_raw) * 1e6:.1f} us: the stub {med_stub * 1e6:.1f}, the runtime double "
        f"{med_runtime * 1e6:.1f}, the rest {left * 1e6:.1f} (the second socket read and loop turns of a call)"
    )
    return {
        "n": n,
        "rpc_us": med_rpc * 1e6,
        "echo_us": med_raw * 1e6,
        "added_us": (med_rpc - med_raw) * 1e6,
        "stub_us": med_stub * 1e6,
        "runtime_us": med_runtime * 1e6,
    }


def measure(n: int) -> dict:
    return asyncio.run(bench(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="round trips of each kind")
    asyncio.run(bench(parser.parse_args().n))


if __name__ == "__main__":
    main()
