"""A runtime-side NRI test double: what containerd, or CRI-O, does to a plugin, over a real socket.

It listens on a unix socket (external plugins) or launches a command with one end of a
socketpair as fd 3 (pre-registered plugins), serves Runtime.RegisterPlugin, then runs the
handshake the runtime runs: Configure (runtime name, version, timeouts, config text), then
Synchronize with the given pods, split into pages with more=true if asked. After that the test
drives pod events with the dedicated RPCs or StateChange, or stops a pod as the runtime does
(`stop_pod`: NRI STOP and the runtime's own teardown in the runtime's order), or creates a
container in a pod (`create_container`: CreateContainer as containerd sends it, to a plugin
subscribed to it, with the container as `container_at_create` builds it). The pod at REMOVE
carries the netns path the runtime gives it there (`pod_at_event`). Every call is bounded by the
request timeout; when it passes, the double closes the plugin's connection, as containerd does.
What the double does per runtime (`RuntimeKind`) is pinned to the real runtimes by
tests/e2e/test_nri_containerd.py and tests/e2e/test_crio_nri.py.

Only the newest connection is "the plugin"; older ones are closed when a new one registers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from nri_cni.api import nri_pb2
from nri_cni.errors import GrpcCode, ProtocolError, RPCError
from nri_cni.nri import mux, trunk
from nri_cni.nri.plugin_service import PLUGIN_SERVICE, RUNTIME_SERVICE
from nri_cni.ttrpc import TtrpcClient, TtrpcServer

log = logging.getLogger(__name__)


@dataclass
class PluginConnection:
    """One plugin connection, as the runtime sees it."""

    trunk: trunk.Trunk
    client: TtrpcClient  # calls the plugin (mux connection 1)
    name: str = ""
    idx: str = ""
    nri_version: str = ""
    configure_response: nri_pb2.ConfigureResponse | None = None
    sync_responses: list[nri_pb2.SynchronizeResponse] = field(default_factory=list)
    # set when Configure and every Synchronize page have been answered as NRI requires
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # why the double gave up on the connection, if it did
    error: str = ""
    update_requests: list[nri_pb2.UpdateContainersRequest] = field(default_factory=list)


@dataclass(frozen=True)
class RuntimeKind:
    """What a plugin sees of one real runtime."""

    name: str  # Configure's runtime_name
    version: str  # Configure's runtime_version
    registration_timeout_ms: int
    request_timeout_ms: int
    # the runtime's own CNI DEL and netns removal run before NRI STOP (CRI-O), not after it (containerd)
    teardown_before_stop: bool
    # REMOVE carries the pod's netns path (CRI-O), not "" (containerd)
    netns_at_remove: bool


# containerd 2.1.9 (../shared/reference/containerd-nri-facts.md)
CONTAINERD = RuntimeKind(
    name="containerd",
    version="2.1.9+unknown",
    registration_timeout_ms=5000,
    request_timeout_ms=2000,
    teardown_before_stop=False,
    netns_at_remove=False,
)
# CRI-O 1.36.3 (../shared/crio/README.md, "How CRI-O drives CNI and NRI")
CRIO = RuntimeKind(
    name="cri-o",
    version="1.36.3",
    registration_timeout_ms=5000,
    request_timeout_ms=2000,
    teardown_before_stop=True,
    netns_at_remove=True,
)

STOP = "stop"  # NRI STOP_POD_SANDBOX
TEARDOWN = "teardown"  # the runtime's own CNI DEL, then the netns removal


def stop_steps(kind: RuntimeKind) -> tuple[str, ...]:
    """The order in which the runtime runs StopPodSandbox."""
    return (TEARDOWN, STOP) if kind.teardown_before_stop else (STOP, TEARDOWN)


def pod_at_event(kind: RuntimeKind, event: int, pod: nri_pb2.PodSandbox) -> nri_pb2.PodSandbox:
    """The pod as the runtime sends it in this event: at REMOVE without its netns path unless
    the runtime keeps it there."""
    out = nri_pb2.PodSandbox()
    out.CopyFrom(pod)
    if event == nri_pb2.REMOVE_POD_SANDBOX and not kind.netns_at_remove:
        for ns in out.linux.namespaces:
            if ns.type == "network":
                ns.path = ""
    return out


def container_at_create(
    pod: nri_pb2.PodSandbox, name: str, args: Sequence[str] = (), annotations: Mapping[str, str] | None = None
) -> nri_pb2.Container:
    """The container in CreateContainer as containerd 2.1.9 fills it (internal/cri/nri): its id,
    its pod's id and its name from the OCI spec; its state UNKNOWN, as containerd's store does
    not hold it yet."""
    return nri_pb2.Container(
        id=os.urandom(32).hex(),
        pod_sandbox_id=pod.id,
        name=name,
        state=nri_pb2.CONTAINER_UNKNOWN,
        annotations=dict(annotations or {}),
        args=list(args),
    )


def subscribed(conn: PluginConnection, event: int) -> bool:
    """Whether the plugin's ConfigureResponse.events has the event's bit (event - 1)."""
    mask = conn.configure_response.events if conn.configure_response is not None else 0
    return bool(mask & (1 << (event - 1)))


class NriRuntime:
    def __init__(
        self,
        socket_path: str | None = None,
        *,
        kind: RuntimeKind = CONTAINERD,
        runtime_name: str | None = None,
        runtime_version: str | None = None,
        nri_version: str = "v0.8.0",
        config: str = "",
        registration_timeout_ms: int | None = None,
        request_timeout_ms: int | None = None,
        pods: Sequence[nri_pb2.PodSandbox] = (),
        containers: Sequence[nri_pb2.Container] = (),
        sync_page_size: int | None = None,
    ) -> None:
        """`kind` gives what the runtime does and its Configure values; the other arguments
        replace single values of it."""
        self.socket_path = socket_path
        self.kind = kind
        self.runtime_name = kind.name if runtime_name is None else runtime_name
        self.runtime_version = kind.version if runtime_version is None else runtime_version
        self.nri_version = nri_version
        self.config = config
        self.registration_timeout_ms = (
            kind.registration_timeout_ms if registration_timeout_ms is None else registration_timeout_ms
        )
        self.request_timeout_ms = (
            kind.request_timeout_ms if request_timeout_ms is None else request_timeout_ms
        )
        self.pods = list(pods)
        self.containers = list(containers)
        self.sync_page_size = sync_page_size
        self.connections: list[PluginConnection] = []  # every one that registered, in order
        self._registered = asyncio.Condition()
        self._server: asyncio.AbstractServer | None = None
        self._trunks: set[trunk.Trunk] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._processes: list[asyncio.subprocess.Process] = []

    # -- setting up --------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on socket_path for external plugins."""
        assert self.socket_path, "start() needs a socket_path"
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._new_trunk, self.socket_path)

    async def stop_listening(self) -> None:
        """Stop accepting and remove the socket file (connections stay)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self.socket_path and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    async def launch(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        idx: str | None = None,
        env: Mapping[str, str] | None = None,
        **popen: object,
    ) -> asyncio.subprocess.Process:
        """Start a pre-registered plugin: argv with a connected socket as fd 3.

        NRI_PLUGIN_NAME / NRI_PLUGIN_IDX are set only when name / idx are given, so that a test
        can check the plugin's fallback to argv[0].
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        child_env = dict(os.environ if env is None else env)
        child_env["NRI_PLUGIN_SOCKET"] = "3"
        for key, value in (("NRI_PLUGIN_NAME", name), ("NRI_PLUGIN_IDX", idx)):
            child_env.pop(key, None)
            if value is not None:
                child_env[key] = value
        child_fd = theirs.fileno()
        try:
            # fd 3 in the child, as containerd's ExtraFiles gives it. dup2 clears close-on-exec
            # on fd 3 only; every other fd of ours is close-on-exec, so close_fds can stay off.
            proc = await asyncio.create_subprocess_exec(
                *argv, env=child_env, close_fds=False, preexec_fn=lambda: os.dup2(child_fd, 3), **popen
            )  # type: ignore[arg-type]
        finally:
            theirs.close()
        self._processes.append(proc)
        await self.adopt(ours)
        return proc

    async def adopt(self, sock: socket.socket) -> None:
        """Serve a plugin on our end of a connected socket pair (the plugin has the other)."""
        await asyncio.get_running_loop().connect_accepted_socket(self._new_trunk, sock)

    # -- waiting for the plugin ---------------------------------------------------------------

    @property
    def plugin(self) -> PluginConnection:
        if not self.connections:
            raise AssertionError("no plugin has registered")
        return self.connections[-1]

    async def wait_plugin(self, count: int = 1, timeout: float = 10.0) -> PluginConnection:
        """The count-th plugin connection that completed its handshake (waits for it)."""
        async with asyncio.timeout(timeout):
            async with self._registered:
                await self._registered.wait_for(lambda: len(self.connections) >= count)
            conn = self.connections[count - 1]
            await conn.ready.wait()
            return conn

    # -- driving the plugin ---------------------------------------------------------------------

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.RunPodSandboxResponse:
        out = await self.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=pod))
        return nri_pb2.RunPodSandboxResponse.FromString(out)

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.StopPodSandboxResponse:
        out = await self.call("StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=pod))
        return nri_pb2.StopPodSandboxResponse.FromString(out)

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.RemovePodSandboxResponse:
        pod = pod_at_event(self.kind, nri_pb2.REMOVE_POD_SANDBOX, pod)
        out = await self.call("RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=pod))
        return nri_pb2.RemovePodSandboxResponse.FromString(out)

    async def state_change(self, event: int, pod: nri_pb2.PodSandbox) -> nri_pb2.Empty:
        pod = pod_at_event(self.kind, event, pod)
        out = await self.call("StateChange", nri_pb2.StateChangeEvent(event=event, pod=pod))
        return nri_pb2.Empty.FromString(out)

    async def stop_pod(self, pod: nri_pb2.PodSandbox, teardown: Callable[[], Awaitable[None]]) -> None:
        """StopPodSandbox as the runtime runs it: NRI STOP (a StateChange event, as both runtimes
        send it) and `teardown` (the runtime's own CNI DEL and netns removal), in its order."""
        for step in stop_steps(self.kind):
            if step == STOP:
                await self.state_change(nri_pb2.STOP_POD_SANDBOX, pod)
            else:
                await teardown()

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse | None:
        """CreateContainer, sent only if the plugin subscribed to it (None otherwise, as the
        runtime then does not call the plugin at all)."""
        if not subscribed(self.plugin, nri_pb2.CREATE_CONTAINER):
            return None
        out = await self.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=container))
        return nri_pb2.CreateContainerResponse.FromString(out)

    async def shutdown(self) -> None:
        await self.call("Shutdown", nri_pb2.Empty())

    async def call(self, method: str, msg: object, conn: PluginConnection | None = None) -> bytes:
        """Call Plugin/method; on a timeout close the connection, as containerd does."""
        conn = conn or self.plugin
        try:
            return await conn.client.call(
                PLUGIN_SERVICE,
                method,
                msg.SerializeToString(),  # type: ignore[attr-defined]
                timeout=self.request_timeout_ms / 1000,
            )
        except RPCError as exc:
            if exc.code == GrpcCode.DEADLINE_EXCEEDED:
                conn.error = f"{method}: {exc}"
                conn.trunk.close()
            raise

    async def close(self) -> None:
        """Drop the current plugin's connection (the plugin should reconnect)."""
        conn = self.plugin
        conn.trunk.close()
        await conn.trunk.closed

    async def stop(self) -> None:
        """Close everything; kill launched plugins."""
        await self.stop_listening()
        for task in list(self._tasks):
            task.cancel()
        for link in list(self._trunks):
            link.close()
            await link.closed
        for proc in self._processes:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    # -- the runtime side of the protocol ------------------------------------------------------

    def _new_trunk(self) -> trunk.Trunk:
        """The runtime side of one plugin connection: client on 1, Runtime service on 2."""
        client = TtrpcClient(name="runtime→plugin")
        conns: list[PluginConnection] = []  # filled right below; the handlers need it

        async def register(payload: bytes) -> bytes:
            req = nri_pb2.RegisterPluginRequest.FromString(payload)
            if not req.plugin_name or len(req.plugin_idx) != 2 or not req.plugin_idx.isdigit():
                raise ProtocolError(
                    f"invalid plugin {req.plugin_idx}-{req.plugin_name}", grpc_code=GrpcCode.INVALID_ARGUMENT
                )
            conn = conns[0]
            conn.name, conn.idx, conn.nri_version = req.plugin_name, req.plugin_idx, req.NRI_version
            # Configure goes out after this answer, as in containerd
            self._spawn(self._handshake(conn))
            return b""  # Empty

        async def update_containers(payload: bytes) -> bytes:
            conns[0].update_requests.append(nri_pb2.UpdateContainersRequest.FromString(payload))
            return nri_pb2.UpdateContainersResponse().SerializeToString()

        server = TtrpcServer(
            {RUNTIME_SERVICE: {"RegisterPlugin": register, "UpdateContainers": update_containers}},
            name="runtime service",
        )
        link = trunk.Trunk(
            {mux.PLUGIN_SERVICE_CONN: client, mux.RUNTIME_SERVICE_CONN: server.protocol()}, name="runtime"
        )
        conns.append(PluginConnection(trunk=link, client=client))
        self._trunks.add(link)
        link.closed.add_done_callback(lambda _: self._trunks.discard(link))
        # containerd drops a connection that does not register in time
        timer = asyncio.get_running_loop().call_later(
            self.registration_timeout_ms / 1000, lambda: None if conns[0].name else link.close()
        )
        link.closed.add_done_callback(lambda _: timer.cancel())
        return link

    async def _handshake(self, conn: PluginConnection) -> None:
        try:
            req = nri_pb2.ConfigureRequest(
                config=self.config,
                runtime_name=self.runtime_name,
                runtime_version=self.runtime_version,
                registration_timeout=self.registration_timeout_ms,
                request_timeout=self.request_timeout_ms,
                NRI_version=self.nri_version,
            )
            conn.configure_response = nri_pb2.ConfigureResponse.FromString(
                await self.call("Configure", req, conn)
            )
            for page in self._sync_pages():
                resp = nri_pb2.SynchronizeResponse.FromString(await self.call("Synchronize", page, conn))
                conn.sync_responses.append(resp)
                if page.more and (not resp.more or len(resp.update)):
                    raise RPCError(
                        GrpcCode.FAILED_PRECONDITION,
                        "plugin did not answer a partial Synchronize with more=true",
                    )
        except Exception as exc:
            conn.error = f"handshake: {exc}"
            log.warning("runtime double: dropping plugin %s-%s: %s", conn.idx, conn.name, exc)
            conn.trunk.close()
            return
        for old in self.connections:
            if old is not conn:
                old.trunk.close()
        async with self._registered:
            self.connections.append(conn)
            self._registered.notify_all()
        conn.ready.set()

    def _sync_pages(self) -> list[nri_pb2.SynchronizeRequest]:
        size = self.sync_page_size or max(len(self.pods), 1)
        chunks = [self.pods[i : i + size] for i in range(0, len(self.pods), size)] or [[]]
        pages = [nri_pb2.SynchronizeRequest(pods=chunk, more=True) for chunk in chunks]
        pages[-1].more = False
        pages[-1].containers.extend(self.containers)
        return pages

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
