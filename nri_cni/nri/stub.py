"""The NRI plugin stub: connect to the runtime, register, serve the Plugin service, reconnect.

In the spirit of containerd/nri pkg/stub, with what that stub leaves to each plugin done here:
it reconnects (with backoff) and registers again whenever the runtime drops the connection,
which containerd does after every request that outlives its timeout.

Two ways to meet the runtime:
  - external: connect to the runtime's socket (default /var/run/nri/nri.sock);
  - pre-registered: the runtime started us with a connected socket as fd NRI_PLUGIN_SOCKET,
    and our name and index in NRI_PLUGIN_NAME / NRI_PLUGIN_IDX (else from argv[0], "NN-name").
    Losing that socket ends run(): the runtime launches its plugins itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping

from nri_cni.api import nri_pb2
from nri_cni.errors import ConfigError, RPCError, Unavailable
from nri_cni.nri import mux, trunk
from nri_cni.nri.handlers import Handlers, handlers_of
from nri_cni.nri.plugin_service import PLUGIN_SERVICE, RUNTIME_SERVICE, PluginService
from nri_cni.ttrpc import TtrpcClient, TtrpcServer

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
SOCKET_ENV = "NRI_PLUGIN_SOCKET"
NAME_ENV = "NRI_PLUGIN_NAME"
IDX_ENV = "NRI_PLUGIN_IDX"
# The NRI release whose API ours follows (plus newer fields), sent in RegisterPluginRequest;
# the runtime only logs it.
NRI_VERSION = "v0.12.2"
_NAME = re.compile(r"[a-zA-Z0-9_.+-]+")
_IDX = re.compile(r"[0-9]{2}")


def check_identity(name: str, idx: str) -> None:
    """The runtime refuses other names and indices; refuse them before connecting."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"invalid NRI plugin name {name!r}: [a-zA-Z0-9_.+-]+ expected")
    if not _IDX.fullmatch(idx):
        raise ConfigError(f"invalid NRI plugin index {idx!r}: two digits expected")


def launch_identity(environ: Mapping[str, str], argv0: str, name: str, idx: str) -> tuple[str, str]:
    """(name, idx) of a pre-registered plugin: the environment, else argv[0] "NN-name",
    else the given ones."""
    env_name, env_idx = environ.get(NAME_ENV, ""), environ.get(IDX_ENV, "")
    base = os.path.basename(argv0)
    if env_name and env_idx:
        return env_name, env_idx
    if env_idx:
        return base, env_idx
    prefix, dash, rest = base.partition("-")
    if dash and rest and _IDX.fullmatch(prefix):
        return env_name or rest, prefix
    return env_name or name, idx


class Stub:
    def __init__(
        self,
        plugin: Handlers | object,
        *,
        name: str,
        idx: str,
        socket_path: str = DEFAULT_SOCKET,
        reconnect: bool = True,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        registration_timeout: float = 5.0,
        observe_request: Callable[[str, float], None] | None = None,
    ) -> None:
        """observe_request(method, seconds): every NRI request answered, how long it took."""
        fd = os.environ.get(SOCKET_ENV, "")
        try:
            self._launch_fd = int(fd) if fd else None
        except ValueError:
            raise ConfigError(f"invalid {SOCKET_ENV}={fd!r}: a file descriptor expected") from None
        if self._launch_fd is not None:
            # the runtime's connection must never reach a CNI plugin: fd 3 came
            # inheritable, as every exec'd child would get it
            try:
                os.set_inheritable(self._launch_fd, False)
            except OSError:
                pass  # not open: connecting to it reports the error
            name, idx = launch_identity(os.environ, sys.argv[0], name, idx)
        check_identity(name, idx)
        self.plugin = handlers_of(plugin)  # what it handles, asked once (pkg/stub's way)
        self.name = name
        self.idx = idx
        self.socket_path = socket_path
        self._reconnect = reconnect
        self._backoff = (backoff_initial, backoff_max)
        self._registration_timeout = registration_timeout
        self._observe_request = observe_request
        # set after Configure / after the last Synchronize page; cleared when the connection goes
        self.registered = asyncio.Event()
        self.synchronized = asyncio.Event()
        # from the last ConfigureRequest
        self.runtime_name = ""
        self.runtime_version = ""
        self.request_timeout_ms = 0
        self.registration_timeout_ms = 0
        self.config = ""
        self._trunk: trunk.Trunk | None = None
        self._stopping = asyncio.Event()
        # Counts connections. Handlers outlive their connection (the transport never cancels
        # them); one finishing late must not mark the next connection configured or synced.
        self._generation = 0

    @property
    def preregistered(self) -> bool:
        return self._launch_fd is not None

    async def run(self) -> None:
        """Serve the runtime until stop(); reconnect when the connection goes (if asked to).

        Raises Unavailable when the first connection cannot be made and reconnecting is off.
        """
        initial, longest = self._backoff
        delay = initial
        while not self._stopping.is_set():
            try:
                link = await self._connect()
            except OSError as exc:
                if self.preregistered or not self._reconnect:
                    raise Unavailable(
                        f"cannot reach the NRI runtime at {self._where()}", details=str(exc)
                    ) from exc
                log.warning(
                    "NRI runtime not reachable at %s (%s); retrying in %.1fs", self._where(), exc, delay
                )
            else:
                if await self._serve(*link):
                    # A working connection was lost (containerd drops us after one slow
                    # answer): pods are being created without us, so try again at once. Only
                    # after Configure: a runtime refusing us at once must not make us spin.
                    delay = 0.0
                if self.preregistered or not self._reconnect or self._stopping.is_set():
                    return
            if delay:
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except TimeoutError:
                    pass
            delay = min(max(delay * 2, initial), longest)

    async def stop(self) -> None:
        self._stopping.set()
        if self._trunk is not None:
            self._trunk.close()
            await self._trunk.closed

    def resync(self) -> None:
        """Ask the runtime for its pod list again: NRI has no call for it, but every
        registration ends in a Synchronize. The connection is closed and made again at once
        (run()); a runtime creates the pods of that instant without this plugin."""
        if self._trunk is not None and self.synchronized.is_set():
            log.info("reconnecting to the NRI runtime for a fresh pod list")
            self._trunk.close()

    def _where(self) -> str:
        return f"fd {self._launch_fd}" if self.preregistered else self.socket_path

    async def _connect(self) -> tuple[trunk.Trunk, TtrpcClient]:
        self._generation += 1
        generation = self._generation

        def configured(req: nri_pb2.ConfigureRequest) -> None:
            if generation == self._generation:
                self._configured(req)

        def synchronized() -> None:
            if generation == self._generation:
                self.synchronized.set()

        service = PluginService(
            self.plugin, on_configured=configured, on_synchronized=synchronized, observe=self._observe_request
        )
        server = TtrpcServer({PLUGIN_SERVICE: service.handlers()}, name="NRI plugin service")
        runtime = TtrpcClient(name="NRI runtime client")
        endpoints = {mux.PLUGIN_SERVICE_CONN: server.protocol(), mux.RUNTIME_SERVICE_CONN: runtime}
        if self._launch_fd is not None:
            sock = socket.socket(fileno=self._launch_fd)
            return await trunk.connect(endpoints, sock=sock, name="nri"), runtime
        return await trunk.connect(endpoints, path=self.socket_path, name="nri"), runtime

    async def _serve(self, link: trunk.Trunk, runtime: TtrpcClient) -> bool:
        """Register and serve until the connection ends; True if the runtime configured us."""
        self._trunk = link
        try:
            if self._stopping.is_set():
                return False
            req = nri_pb2.RegisterPluginRequest(
                plugin_name=self.name, plugin_idx=self.idx, NRI_version=NRI_VERSION
            )
            await runtime.call(
                RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), timeout=self._registration_timeout
            )
            log.info("registered with the NRI runtime as %s-%s", self.idx, self.name)
            await link.closed
            if not self._stopping.is_set():
                log.warning("NRI runtime closed the connection")
        except (RPCError, Unavailable) as exc:
            log.warning("NRI registration failed: %s", exc)
        finally:
            link.close()
            await link.closed
            self._trunk = None
            self._generation += 1
            configured = self.registered.is_set()
            self.registered.clear()
            self.synchronized.clear()
        if not self._stopping.is_set():
            await self._notify_disconnect()
        return configured

    def _configured(self, req: nri_pb2.ConfigureRequest) -> None:
        self.runtime_name = req.runtime_name
        self.runtime_version = req.runtime_version
        self.request_timeout_ms = req.request_timeout
        self.registration_timeout_ms = req.registration_timeout
        self.config = req.config
        log.info(
            "configured by %s %s (request timeout %d ms)",
            req.runtime_name,
            req.runtime_version,
            req.request_timeout,
        )
        self.registered.set()

    async def _notify_disconnect(self) -> None:
        hook = self.plugin.on_disconnect
        if hook is None:
            return
        try:
            await hook()
        except Exception:
            log.exception("plugin's on_disconnect failed")
