"""The plugin Stub against the runtime double, over a real unix socket."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

import pytest

from nri_cni.api import nri_pb2
from nri_cni.errors import WIRE, ConfigError, GrpcCode, Kind, PodError, ProtocolError, RPCError, Unavailable
from nri_cni.nri import mux
from nri_cni.nri.plugin_service import RUNTIME_SERVICE
from nri_cni.nri.stub import Stub, check_identity, launch_identity
from nri_cni.nri.trunk import Trunk
from nri_cni.ttrpc import TtrpcClient, TtrpcServer
from nri_cni.ttrpc.server import request_deadline
from tests.support.nri_runtime import NriRuntime


def pod(name: str, **fields) -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id=f"id-{name}", name=name, namespace="default", uid=f"uid-{name}", **fields)


def network_answer(pod: nri_pb2.PodSandbox) -> nri_pb2.RunPodSandboxResponse:
    netns = pod.linux.namespaces[0].path if pod.linux.namespaces else ""
    return nri_pb2.RunPodSandboxResponse(
        adjust=nri_pb2.PodSandboxAdjustment(
            network=nri_pb2.PodSandboxNetwork(
                ips=["10.244.3.7", "fd00:10:244::7"],
                interfaces=[
                    nri_pb2.NetworkInterface(
                        network="nct-net",
                        name="eth0",
                        mac="0a:58:0a:f4:03:07",
                        mtu=1500,
                        sandbox=netns,
                        ips=[nri_pb2.IPConfig(address="10.244.3.7/24", gateway="10.244.3.1")],
                        metadata={"nri-cni.io/pod": pod.name},
                    )
                ],
                routes=[
                    nri_pb2.NetworkRoute(
                        network="nct-net", dst="0.0.0.0/0", gw="10.244.3.1", interface="eth0"
                    )
                ],
                dns=nri_pb2.NetworkDNS(nameservers=["10.244.0.10"], search=["svc.local"]),
            )
        )
    )


class Recorder:
    """A plugin implementing everything, recording the calls."""

    requested_timeout_ms = 9000

    def __init__(self, run_delay: float = 0.0) -> None:
        self.calls: list[tuple] = []
        self.run_delay = run_delay
        self.disconnected = asyncio.Event()

    async def configure(self, req):
        self.calls.append(("configure", req.runtime_name, req.config))

    async def synchronize(self, pods, containers):
        self.calls.append(("synchronize", [p.id for p in pods], [c.id for c in containers]))

    async def run_pod_sandbox(self, pod):
        await asyncio.sleep(self.run_delay)
        self.calls.append(("run", pod.id))
        if pod.name == "fails":
            raise PodError("ADD failed", network="nct-net")
        if pod.name == "crashes":
            raise KeyError("oops")
        return network_answer(pod)

    async def stop_pod_sandbox(self, pod):
        self.calls.append(("stop", pod.id))

    async def remove_pod_sandbox(self, pod):
        self.calls.append(("remove", pod.id))

    async def shutdown(self):
        self.calls.append(("shutdown",))

    async def on_disconnect(self):
        self.calls.append(("disconnect",))
        self.disconnected.set()


class RunOnly:
    async def run_pod_sandbox(self, pod):
        return None


class Harness:
    """A runtime double on a socket, and a Stub serving `plugin` in a task."""

    def __init__(self, sock_dir, plugin, runtime_kw=None, **stub_kw) -> None:
        self.path = str(sock_dir / "nri.sock")
        self.runtime = NriRuntime(self.path, **(runtime_kw or {}))
        self.plugin = plugin
        stub_kw.setdefault("backoff_initial", 0.05)
        self.stub = Stub(plugin, name="nct-cni", idx="42", socket_path=self.path, **stub_kw)
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> Harness:
        await self.runtime.start()
        self.task = asyncio.create_task(self.stub.run())
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stub.stop()
        await asyncio.wait_for(self.task, 60)
        await self.runtime.stop()


def test_handshake(arun, sock_dir):
    async def main():
        kw = dict(
            runtime_name="containerd",
            runtime_version="2.1.9+unknown",
            config="cfg text",
            registration_timeout_ms=5000,
            request_timeout_ms=2000,
        )
        async with Harness(sock_dir, Recorder(), kw) as h:
            conn = await h.runtime.wait_plugin()
            assert (conn.name, conn.idx) == ("nct-cni", "42")
            assert conn.nri_version
            assert conn.configure_response.events == 0x7
            assert conn.configure_response.request_timeout == 9000
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            assert h.stub.registered.is_set()
            assert (h.stub.runtime_name, h.stub.runtime_version, h.stub.config) == (
                "containerd",
                "2.1.9+unknown",
                "cfg text",
            )
            assert (h.stub.request_timeout_ms, h.stub.registration_timeout_ms) == (2000, 5000)
            assert h.plugin.calls == [("configure", "containerd", "cfg text"), ("synchronize", [], [])]

    arun(main())


def test_event_mask_follows_implemented_methods(arun, sock_dir):
    async def main():
        async with Harness(sock_dir, RunOnly()) as h:
            conn = await h.runtime.wait_plugin()
            assert conn.configure_response.events == 0x1
            assert conn.configure_response.request_timeout == 0
            # a dedicated RPC the plugin has no method for is answered OK, as is StateChange
            await h.runtime.stop_pod_sandbox(pod("a"))
            await h.runtime.state_change(nri_pb2.STOP_POD_SANDBOX, pod("a"))
            assert await h.runtime.run_pod_sandbox(pod("a")) == nri_pb2.RunPodSandboxResponse()

    arun(main())


def test_synchronize_pages_are_joined(arun, sock_dir):
    async def main():
        pods = [pod(f"p{i}", ips=[f"10.244.9.{i}"]) for i in range(5)]
        containers = [nri_pb2.Container(id="c1", pod_sandbox_id="id-p0")]
        kw = dict(pods=pods, containers=containers, sync_page_size=2)
        async with Harness(sock_dir, Recorder(), kw) as h:
            conn = await h.runtime.wait_plugin()
            assert [r.more for r in conn.sync_responses] == [True, True, False]
            assert all(not r.update for r in conn.sync_responses)
            assert h.plugin.calls[1:] == [("synchronize", [p.id for p in pods], ["c1"])]

    arun(main())


def test_dedicated_rpcs_and_network_answer(arun, sock_dir):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            p = pod(
                "web",
                linux=nri_pb2.LinuxPodSandbox(
                    namespaces=[nri_pb2.LinuxNamespace(type="network", path="/var/run/netns/nct-web")]
                ),
            )
            resp = await h.runtime.run_pod_sandbox(p)
            assert resp == network_answer(p)
            net = resp.adjust.network
            assert list(net.ips) == ["10.244.3.7", "fd00:10:244::7"]
            assert net.interfaces[0].sandbox == "/var/run/netns/nct-web"
            assert net.interfaces[0].ips[0].address == "10.244.3.7/24"
            assert net.interfaces[0].metadata["nri-cni.io/pod"] == "web"
            assert net.routes[0].gw == "10.244.3.1" and list(net.dns.nameservers) == ["10.244.0.10"]
            await h.runtime.stop_pod_sandbox(p)
            await h.runtime.remove_pod_sandbox(p)
            await h.runtime.shutdown()
            assert h.plugin.calls[2:] == [
                ("run", "id-web"),
                ("stop", "id-web"),
                ("remove", "id-web"),
                ("shutdown",),
            ]

    arun(main())


def test_state_change_dispatches_pod_events(arun, sock_dir):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            for event in (
                nri_pb2.RUN_POD_SANDBOX,
                nri_pb2.STOP_POD_SANDBOX,
                nri_pb2.REMOVE_POD_SANDBOX,
                nri_pb2.CREATE_CONTAINER,
                nri_pb2.UPDATE_POD_SANDBOX,
            ):
                assert await h.runtime.state_change(event, pod("s")) == nri_pb2.Empty()
            assert h.plugin.calls[2:] == [("run", "id-s"), ("stop", "id-s"), ("remove", "id-s")]

    arun(main())


def test_handler_errors_reach_the_runtime_and_the_connection_stays(arun, sock_dir, caplog):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            with pytest.raises(RPCError) as info:
                await h.runtime.run_pod_sandbox(pod("fails"))
            assert info.value.code == WIRE[Kind.FAILED].grpc
            assert "ADD failed" in info.value.msg
            with pytest.raises(RPCError) as info:
                await h.runtime.state_change(nri_pb2.RUN_POD_SANDBOX, pod("crashes"))
            assert info.value.code == GrpcCode.UNKNOWN and "oops" in info.value.msg
            assert (await h.runtime.run_pod_sandbox(pod("ok"))).adjust.network.ips
            assert len(h.runtime.connections) == 1

    with caplog.at_level(logging.ERROR):
        arun(main())
    assert "ADD failed" in caplog.text and "KeyError" in caplog.text
    assert "NRI plugin service: " in caplog.text  # the server's log lines name it


def test_undecodable_request_is_invalid_argument(arun, sock_dir):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            conn = await h.runtime.wait_plugin()
            with pytest.raises(RPCError) as info:
                await conn.client.call("nri.pkg.api.v1alpha1.Plugin", "RunPodSandbox", b"\x0a\x05")
            assert info.value.code == GrpcCode.INVALID_ARGUMENT

    arun(main())


def test_reconnects_after_the_runtime_drops_the_connection(arun, sock_dir):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            await h.runtime.close()
            conn = await h.runtime.wait_plugin(2)
            assert (conn.name, conn.idx) == ("nct-cni", "42")
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            assert h.plugin.calls.count(("disconnect",)) == 1
            assert (await h.runtime.run_pod_sandbox(pod("again"))).adjust.network.ips

    arun(main())


def test_request_timeout_drops_the_plugin_which_comes_back(arun, sock_dir):
    async def main():
        plugin = Recorder(run_delay=0.5)
        async with Harness(sock_dir, plugin, dict(request_timeout_ms=200)) as h:
            first = await h.runtime.wait_plugin()
            with pytest.raises(RPCError) as info:
                await h.runtime.run_pod_sandbox(pod("slow"))
            assert info.value.code == GrpcCode.DEADLINE_EXCEEDED
            assert "RunPodSandbox" in first.error
            await first.trunk.closed
            await asyncio.wait_for(plugin.disconnected.wait(), 60)
            await h.runtime.wait_plugin(2)
            # the slow RunPodSandbox was not cut short by the dropped connection
            while ("run", "id-slow") not in plugin.calls:
                await asyncio.sleep(0.05)

    arun(main())


def test_socket_removed_and_recreated(arun, sock_dir, caplog):
    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            with Logged("not reachable") as retrying:
                await h.runtime.stop()  # the runtime goes away, socket file and all
                assert not os.path.exists(h.path)
                await retrying.seen.wait()  # the stub retries meanwhile (backoff 0.05, 0.1, 0.2...)
            assert not h.stub.registered.is_set()
            second = NriRuntime(h.path, runtime_name="restarted")
            await second.start()
            try:
                conn = await second.wait_plugin()
                assert conn.name == "nct-cni"
                await asyncio.wait_for(h.stub.registered.wait(), 60)
                assert h.stub.runtime_name == "restarted"
            finally:
                await second.stop()

    with caplog.at_level(logging.WARNING):
        arun(main())
    assert "not reachable" in caplog.text


def test_without_reconnect_run_returns_when_the_connection_goes(arun, sock_dir):
    async def main():
        h = Harness(sock_dir, Recorder(), reconnect=False)
        async with h:
            await h.runtime.wait_plugin()
            await h.runtime.close()
            await asyncio.wait_for(h.task, 60)
            assert ("disconnect",) in h.plugin.calls

    arun(main())


def test_without_reconnect_no_runtime_is_unavailable(arun, sock_dir):
    async def main():
        stub = Stub(Recorder(), name="x", idx="01", socket_path=str(sock_dir / "none.sock"), reconnect=False)
        with pytest.raises(Unavailable):
            await stub.run()

    arun(main())


class Logged(logging.Handler):
    """`seen` is set once the stub logs a warning holding `text`: the event a test waits for."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.seen = asyncio.Event()
        self.logger = logging.getLogger("nri_cni.nri.stub")

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def __enter__(self) -> Logged:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


def test_stop_ends_run_while_retrying(arun, sock_dir):
    """The stub waits out an hour's backoff; stop() must end run() at once. Were the backoff
    not cut short, run() would not return and the test would never end (the suite's timeout
    fails it). Control case: the same stub with reconnect=False has no backoff to wait out
    and run() raises Unavailable (test_without_reconnect_no_runtime_is_unavailable)."""

    async def main():
        stub = Stub(
            Recorder(),
            name="x",
            idx="01",
            socket_path=str(sock_dir / "none.sock"),
            backoff_initial=3600,
            backoff_max=3600,
        )
        with Logged("retrying in") as backing_off:
            task = asyncio.create_task(stub.run())
            await backing_off.seen.wait()  # the first attempt failed: the backoff has begun
        assert not task.done()
        await stub.stop()
        await task

    arun(main())


async def _registrar(sock_dir, register, trunks: list[Trunk] | None = None):
    """A runtime that answers RegisterPlugin with `register` and nothing else: its socket's
    path and listener; each connection's Trunk is added to `trunks`."""
    server = TtrpcServer({RUNTIME_SERVICE: {"RegisterPlugin": register}})
    path = str(sock_dir / "nri.sock")

    def trunk() -> Trunk:
        made = Trunk({1: TtrpcClient(), 2: server.protocol()})
        if trunks is not None:
            trunks.append(made)
        return made

    listener = await asyncio.get_running_loop().create_unix_server(trunk, path)
    return path, listener


def test_registration_hanging_or_refused_is_retried_with_backoff(arun, sock_dir):
    async def main():
        attempts: list[float] = []  # when each arrived
        third = asyncio.Event()

        async def register(payload: bytes) -> bytes:
            attempts.append(loop.time())
            if len(attempts) == 3:
                third.set()
            if len(attempts) == 1:
                await asyncio.Event().wait()  # never answers: only the registration timeout ends it
            if len(attempts) == 2:
                raise ProtocolError("not now", grpc_code=GrpcCode.PERMISSION_DENIED)
            return b""

        loop = asyncio.get_running_loop()
        path, listener = await _registrar(sock_dir, register)
        stub = Stub(
            Recorder(), name="x", idx="01", socket_path=path, backoff_initial=0.1, registration_timeout=0.2
        )
        task = asyncio.create_task(stub.run())
        try:
            # refused twice (the first time by the stub's own timeout: that registration never
            # answers), tried a third time; no gap is measured (the server sees an attempt
            # when it arrives, and a timer may fire a clock tick early)
            await third.wait()
            assert len(attempts) == 3
        finally:
            await stub.stop()
            await asyncio.wait_for(task, 60)
            listener.close()
            await listener.wait_closed()

    arun(main())


@pytest.mark.parametrize(
    "name, idx", [("", "01"), ("bad name", "01"), ("x/y", "01"), ("ok", "1"), ("ok", "123"), ("ok", "a1")]
)
def test_identity_is_checked(name, idx):
    """The refusal names the value and what was expected of it (control: the other field)."""
    with pytest.raises(ConfigError) as info:
        check_identity(name, idx)
    if name in ("", "bad name", "x/y"):
        assert str(info.value) == f"invalid NRI plugin name {name!r}: [a-zA-Z0-9_.+-]+ expected"
    else:
        assert str(info.value) == f"invalid NRI plugin index {idx!r}: two digits expected"


def test_identity_accepts_the_nri_alphabet():
    check_identity("a-Z_0.9+x", "00")


@pytest.mark.parametrize(
    "env, argv0, expected",
    [
        ({"NRI_PLUGIN_NAME": "cni", "NRI_PLUGIN_IDX": "10"}, "/opt/nri/plugins/20-x", ("cni", "10")),
        ({"NRI_PLUGIN_IDX": "10"}, "/opt/nri/plugins/nri-cni", ("nri-cni", "10")),
        ({}, "/opt/nri/plugins/05-nri-cni", ("nri-cni", "05")),
        ({"NRI_PLUGIN_NAME": "cni"}, "/opt/nri/plugins/05-nri-cni", ("cni", "05")),
        ({}, "/usr/bin/nri-cni", ("given", "99")),
        ({}, "/opt/nri/plugins/5-x", ("given", "99")),
    ],
)
def test_launch_identity(env, argv0, expected):
    assert launch_identity(env, argv0, "given", "99") == expected


def test_invalid_socket_fd_in_env_is_a_config_error(monkeypatch):
    monkeypatch.setenv("NRI_PLUGIN_SOCKET", "three")
    with pytest.raises(ConfigError) as info:
        Stub(Recorder(), name="x", idx="01")
    assert str(info.value) == "invalid NRI_PLUGIN_SOCKET='three': a file descriptor expected"


@pytest.mark.parametrize(
    "env, argv, expected",
    [
        ({"NRI_PLUGIN_IDX": "07"}, ["/opt/nri/plugins/nri-cni", "07-other"], ("nri-cni", "07")),  # argv[0]
        ({}, ["/usr/bin/nri-cni", "07-other"], ("given", "42")),  # neither: the given name and index
    ],
)
def test_a_preregistered_stub_takes_its_identity_from_its_launch(monkeypatch, env, argv, expected):
    """A stub started by the runtime (NRI_PLUGIN_SOCKET set) is named by the environment or
    its own argv[0] "NN-name", else by the given name and index; argv[1] is nobody's name.
    The two rows are each other's control (launch_identity's table: test_launch_identity)."""
    a, b = socket.socketpair()
    try:
        monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(a.fileno()))
        monkeypatch.delenv("NRI_PLUGIN_NAME", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", argv)
        stub = Stub(Recorder(), name="given", idx="42", socket_path="/nonexistent")
        assert (stub.name, stub.idx) == expected
    finally:
        a.close()
        b.close()


class SlowSync:
    """Synchronize takes 0.5 s the first time, 1 s the second."""

    def __init__(self) -> None:
        self.delays = [0.5, 1.0]
        self.first_sync_done = asyncio.Event()
        self.disconnected = asyncio.Event()

    async def synchronize(self, pods, containers):
        await asyncio.sleep(self.delays.pop(0))
        self.first_sync_done.set()

    async def on_disconnect(self):
        self.disconnected.set()


def test_a_handler_of_a_lost_connection_does_not_mark_the_next_one_synced(arun, sock_dir):
    async def main():
        plugin = SlowSync()
        async with Harness(sock_dir, plugin, dict(request_timeout_ms=200)) as h:
            await asyncio.wait_for(plugin.disconnected.wait(), 60)  # Synchronize timed out
            h.runtime.request_timeout_ms = 3000
            await asyncio.wait_for(plugin.first_sync_done.wait(), 60)
            # the first connection's Synchronize is done; the second one's is still running
            assert not h.stub.synchronized.is_set()
            await h.runtime.wait_plugin()
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)

    arun(main())


class HeldSync(Recorder):
    """A Recorder whose first Synchronize waits for `release`; `syncing` is set when it began."""

    def __init__(self) -> None:
        super().__init__()
        self.syncing = asyncio.Event()
        self.release = asyncio.Event()

    async def synchronize(self, pods, containers):
        self.syncing.set()
        await self.release.wait()
        await super().synchronize(pods, containers)


def test_resync_once_synchronized_reconnects(arun, sock_dir):
    """resync() after the Synchronize closes the connection and the stub registers again.
    Control case: test_resync_during_the_handshake_changes_nothing (not yet synchronized: the
    same call leaves the connection alone)."""

    async def main():
        async with Harness(sock_dir, Recorder()) as h:
            await h.runtime.wait_plugin()
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            h.stub.resync()
            await h.runtime.wait_plugin(2)
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            assert h.plugin.calls.count(("disconnect",)) == 1

    arun(main())


def test_resync_during_the_handshake_changes_nothing(arun, sock_dir):
    """Connected but not yet synchronized: resync() keeps the connection, whose Synchronize
    then completes (no disconnect, one Synchronize). Control case:
    test_resync_once_synchronized_reconnects."""

    async def main():
        plugin = HeldSync()
        async with Harness(sock_dir, plugin) as h:
            await plugin.syncing.wait()
            h.stub.resync()
            plugin.release.set()
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            assert ("disconnect",) not in plugin.calls
            assert [c[0] for c in plugin.calls].count("synchronize") == 1

    arun(main())


@pytest.mark.parametrize("preregistered", [True, False])
def test_unavailable_names_where_the_runtime_was_looked_for(arun, sock_dir, monkeypatch, preregistered):
    """The error names the inherited fd of a pre-registered plugin, else the socket path. The
    two cases are each other's control: only NRI_PLUGIN_SOCKET differs."""
    path = str(sock_dir / "none.sock")
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)  # a number no file is open under
    if preregistered:
        monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(fd))
        monkeypatch.setenv("NRI_PLUGIN_NAME", "x")
        monkeypatch.setenv("NRI_PLUGIN_IDX", "01")
    else:
        monkeypatch.delenv("NRI_PLUGIN_SOCKET", raising=False)
    stub = Stub(Recorder(), name="x", idx="01", socket_path=path, reconnect=False)
    with pytest.raises(Unavailable) as info:
        arun(stub.run())
    expected = f"fd {fd}" if preregistered else path
    assert expected in str(info.value)
    assert info.value.details == str(info.value.__cause__) and isinstance(info.value.__cause__, OSError)
    assert (path in str(info.value)) is not preregistered


def test_a_lost_configured_connection_is_made_again_at_once(arun, sock_dir, monkeypatch):
    """After the runtime drops a connection that had been configured, the stub registers again
    without waiting out any backoff (no wait on its stop event with a timeout). Control case:
    test_stop_ends_run_while_retrying, where no connection was made, waits out the backoff."""
    h = Harness(sock_dir, Recorder(), backoff_initial=3600, backoff_max=3600)
    backoffs: list[float] = []
    wait_for = asyncio.wait_for

    def recording(aw, timeout):
        frame = getattr(aw, "cr_frame", None)
        if frame is not None and frame.f_locals.get("self") is h.stub._stopping:
            backoffs.append(timeout)
        return wait_for(aw, timeout)

    async def main():
        async with h:
            await h.runtime.wait_plugin()
            await h.runtime.close()
            await h.runtime.wait_plugin(2)
            assert backoffs == []

    monkeypatch.setattr(asyncio, "wait_for", recording)
    arun(main())


@pytest.mark.parametrize("stopping", [False, True])
def test_a_closed_connection_is_logged_unless_stopping(arun, sock_dir, caplog, stopping):
    """The runtime closing the connection is a warning; stop() closing it is not. The two cases
    are each other's control: only who closed the connection differs."""

    async def main():
        h = Harness(sock_dir, Recorder(), reconnect=False)
        async with h:
            await h.runtime.wait_plugin()
            if stopping:
                await h.stub.stop()
            else:
                await h.runtime.close()
            await asyncio.wait_for(h.task, 60)

    with caplog.at_level(logging.WARNING, logger="nri_cni.nri.stub"):
        arun(main())
    assert ("NRI runtime closed the connection" in caplog.text) is not stopping


class GatedSync:
    """Each Synchronize waits for its own gate; `entered[n]` is set when the n-th began and
    `finished[n]` when it returned."""

    def __init__(self, count: int) -> None:
        self.gates = [asyncio.Event() for _ in range(count)]
        self.entered = [asyncio.Event() for _ in range(count)]
        self.finished = [asyncio.Event() for _ in range(count)]
        self.calls = 0

    async def synchronize(self, pods, containers):
        n = self.calls
        self.calls += 1
        self.entered[n].set()
        await self.gates[n].wait()
        self.finished[n].set()


def test_a_late_handler_of_any_lost_connection_does_not_mark_a_later_one_synced(arun, sock_dir):
    """Two connections are lost while their Synchronize runs; the second one's, finishing during
    the third connection's, must not mark the stub synchronized. Control case: the third's own
    Synchronize finishing does."""

    async def main():
        plugin = GatedSync(3)
        async with Harness(sock_dir, plugin, dict(request_timeout_ms=200)) as h:
            await plugin.entered[1].wait()  # the first connection was dropped, its handler hangs
            h.runtime.request_timeout_ms = 60000
            await plugin.entered[2].wait()  # the second was dropped too
            plugin.gates[1].set()
            await plugin.finished[1].wait()
            assert not h.stub.synchronized.is_set()
            plugin.gates[2].set()
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            plugin.gates[0].set()

    arun(main())


def test_the_backoff_doubles_up_to_its_longest(arun, sock_dir, monkeypatch):
    """No runtime: the waits between attempts start at backoff_initial and double up to
    backoff_max. Control case: test_a_lost_configured_connection_is_made_again_at_once, where
    the connection had worked, waits none."""
    stub = Stub(
        Recorder(),
        name="x",
        idx="01",
        socket_path=str(sock_dir / "none.sock"),
        backoff_initial=0.001,
        backoff_max=0.004,
    )
    assert _backoffs(arun, monkeypatch, stub, 5, cut_short=False) == [0.001, 0.002, 0.004, 0.004, 0.004]


def _backoffs(arun, monkeypatch, stub: Stub, n: int, *, cut_short: bool) -> list[float]:
    """The first `n` waits between the stub's attempts (no runtime listens), each cut to no
    time when `cut_short`; then the stub is stopped."""
    backoffs: list[float] = []
    enough = asyncio.Event()
    wait_for = asyncio.wait_for

    def recording(aw, timeout):
        frame = getattr(aw, "cr_frame", None)
        if frame is not None and frame.f_locals.get("self") is stub._stopping:
            backoffs.append(timeout)
            if len(backoffs) == n:
                enough.set()
            if cut_short:
                timeout = 0
        return wait_for(aw, timeout)

    async def main():
        task = asyncio.create_task(stub.run())
        await enough.wait()
        await stub.stop()
        await task

    monkeypatch.setattr(asyncio, "wait_for", recording)
    arun(main())
    return backoffs[:n]


def test_every_answered_request_is_observed(arun, sock_dir):
    seen: list[tuple[str, float]] = []

    async def main():
        async with Harness(sock_dir, Recorder(), observe_request=lambda m, s: seen.append((m, s))) as h:
            await asyncio.wait_for(h.stub.synchronized.wait(), 60)
            await h.runtime.run_pod_sandbox(pod("seen"))

    arun(main())
    assert [m for m, _ in seen] == ["Configure", "Synchronize", "RunPodSandbox"]
    assert all(s >= 0 for _, s in seen)


def test_a_preregistered_stub_serves_its_inherited_socket(arun, monkeypatch):
    """In process (test_prereg.py runs it as the runtime would, as a child): the fd in
    NRI_PLUGIN_SOCKET is the connection, made non-inheritable; losing it ends run()."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = theirs.detach()
    os.set_inheritable(fd, True)
    monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(fd))
    monkeypatch.setenv("NRI_PLUGIN_NAME", "cni")
    monkeypatch.setenv("NRI_PLUGIN_IDX", "05")
    stub = Stub(Recorder(), name="unused", idx="99", socket_path="/nonexistent")
    assert stub.preregistered and not os.get_inheritable(fd)

    async def main():
        runtime = NriRuntime()
        try:
            await runtime.adopt(ours)
            task = asyncio.create_task(stub.run())
            conn = await runtime.wait_plugin()
            assert (conn.name, conn.idx) == ("cni", "05")
            await asyncio.wait_for(stub.synchronized.wait(), 60)
            await runtime.close()
            await asyncio.wait_for(task, 60)
        finally:
            await runtime.stop()

    arun(main())


def test_the_default_backoff_starts_at_a_fifth_of_a_second_and_doubles_to_five(arun, sock_dir, monkeypatch):
    """The daemon's stub (nri_cni/daemon/app.py gives no backoff) waits 0.2 s after a failed
    attempt, then twice as long each time, up to 5 s. Each wait is recorded and then cut short
    (no time passes). Control case: test_the_backoff_doubles_up_to_its_longest, where the given
    bounds replace these."""
    stub = Stub(Recorder(), name="x", idx="01", socket_path=str(sock_dir / "none.sock"))
    assert _backoffs(arun, monkeypatch, stub, 7, cut_short=True) == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


@pytest.mark.parametrize("given, deadline", [(None, 5.0), (0.5, 0.5)])
def test_the_registration_carries_its_timeout_as_its_deadline(arun, sock_dir, given, deadline):
    """RegisterPlugin goes out with the stub's registration timeout as the request's deadline:
    5 s unless one is given. The two cases are each other's control: only the argument differs."""

    async def main():
        seen: list[float] = []
        registered = asyncio.Event()

        async def register(payload: bytes) -> bytes:
            seen.append(request_deadline().timeout)
            registered.set()
            return b""

        path, listener = await _registrar(sock_dir, register)
        kw = {} if given is None else {"registration_timeout": given}
        stub = Stub(Recorder(), name="x", idx="01", socket_path=path, **kw)
        task = asyncio.create_task(stub.run())
        try:
            await registered.wait()
            assert seen == [deadline]
        finally:
            await stub.stop()
            await task
            listener.close()
            await listener.wait_closed()

    arun(main())


def test_before_any_configure_the_stub_knows_no_runtime():
    """What the daemon reports (and takes its NRI deadline from) before the runtime configured
    it: no name, no version, no timeouts. Control case: test_handshake, where Configure set them."""
    stub = Stub(Recorder(), name="x", idx="01", socket_path="/nonexistent")
    assert (stub.runtime_name, stub.runtime_version, stub.config) == ("", "", "")
    assert (stub.request_timeout_ms, stub.registration_timeout_ms) == (0, 0)
    assert not stub.registered.is_set() and not stub.synchronized.is_set() and not stub.preregistered


@pytest.mark.parametrize("preregistered", [True, False])
def test_a_runtime_that_breaks_the_mux_is_named_in_the_log(
    arun, sock_dir, monkeypatch, caplog, preregistered
):
    """A runtime that sends a mux chunk over the size limit: the socket is closed with a log
    line naming the NRI trunk ("nri: closing the socket"), whether the stub was launched with
    the runtime's socket or connected to its path (each case the other's control: only how the
    stub reached the runtime differs)."""
    garbage = mux.HEADER.pack(1, mux.MAX_PAYLOAD + 1)

    async def main():
        if preregistered:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            monkeypatch.setenv("NRI_PLUGIN_SOCKET", str(theirs.detach()))
            monkeypatch.setenv("NRI_PLUGIN_NAME", "x")
            monkeypatch.setenv("NRI_PLUGIN_IDX", "01")
            ours.sendall(garbage)
            path = "/nonexistent"
        else:
            monkeypatch.delenv("NRI_PLUGIN_SOCKET", raising=False)
            path = str(sock_dir / "nri.sock")

            def send_garbage(reader, writer):
                writer.write(garbage)

            server = await asyncio.start_unix_server(send_garbage, path)
        stub = Stub(Recorder(), name="x", idx="01", socket_path=path, reconnect=False)
        try:
            await asyncio.wait_for(stub.run(), 60)  # the socket closed: run ends (no reconnect)
        finally:
            if preregistered:
                ours.close()
            else:
                server.close()
                await server.wait_closed()

    with caplog.at_level(logging.ERROR):
        arun(main())
    assert "nri: closing the socket: mux chunk of" in caplog.text


def test_a_runtime_gone_in_the_registration_is_named_by_the_client(arun, sock_dir, caplog):
    """The runtime closes the connection while RegisterPlugin waits for its answer: the stub's
    warning names its runtime client ("NRI runtime client: connection lost")."""

    async def main():
        asked = asyncio.Event()

        async def register(payload: bytes) -> bytes:
            asked.set()
            await asyncio.Event().wait()  # never answers: the connection goes first
            return b""

        trunks: list[Trunk] = []
        path, listener = await _registrar(sock_dir, register, trunks)
        stub = Stub(Recorder(), name="x", idx="01", socket_path=path, reconnect=False)
        task = asyncio.create_task(stub.run())
        try:
            await asyncio.wait_for(asked.wait(), 60)
            trunks[0].close()
            await asyncio.wait_for(task, 60)
        finally:
            await stub.stop()
            listener.close()
            await listener.wait_closed()

    with caplog.at_level(logging.WARNING):
        arun(main())
    assert "NRI registration failed: NRI runtime client: connection lost" in caplog.text
