"""What an NRI plugin handles, declared: one typed slot per request, implemented or not.

containerd/nri's pkg/stub asks once, when the stub is made, which of its handler interfaces the
plugin implements (ConfigureInterface, SynchronizeInterface, RunPodInterface, ...) and keeps
the answer; the events the plugin subscribes to follow from it. The same here: `handlers_of`
checks the plugin against one Protocol per handler, once, and returns `Handlers`, whose unset
slots (None) are the requests the plugin leaves to the stub's default answer. Nothing looks a
method up by its name while serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nri_cni.api import nri_pb2

NO_TIMEOUT_REQUEST = 0  # the runtime's own default applies
PodHandler = Callable[[nri_pb2.PodSandbox], Awaitable[None]]
RunPodHandler = Callable[[nri_pb2.PodSandbox], Awaitable["nri_pb2.RunPodSandboxResponse | None"]]
CreateContainerHandler = Callable[
    [nri_pb2.PodSandbox, nri_pb2.Container], Awaitable["nri_pb2.CreateContainerResponse | None"]
]


@runtime_checkable
class Configures(Protocol):
    async def configure(self, req: nri_pb2.ConfigureRequest) -> None: ...


@runtime_checkable
class Synchronizes(Protocol):
    async def synchronize(
        self, pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]
    ) -> None: ...


@runtime_checkable
class ShutsDown(Protocol):
    async def shutdown(self) -> None: ...


@runtime_checkable
class RunsPods(Protocol):
    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.RunPodSandboxResponse | None: ...


@runtime_checkable
class StopsPods(Protocol):
    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None: ...


@runtime_checkable
class RemovesPods(Protocol):
    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None: ...


@runtime_checkable
class CreatesContainers(Protocol):
    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse | None: ...


@runtime_checkable
class HearsDisconnects(Protocol):
    """Not a request: the stub calls it when the runtime's connection is gone."""

    async def on_disconnect(self) -> None: ...


@runtime_checkable
class AsksTimeout(Protocol):
    """ConfigureResponse.request_timeout (NRI PR #304): an int, or a method returning one."""

    requested_timeout_ms: int | Callable[[], int]


@dataclass(frozen=True)
class Handlers:
    configure: Callable[[nri_pb2.ConfigureRequest], Awaitable[None]] | None = None
    synchronize: Callable[[list[nri_pb2.PodSandbox], list[nri_pb2.Container]], Awaitable[None]] | None = None
    shutdown: Callable[[], Awaitable[None]] | None = None
    run_pod_sandbox: RunPodHandler | None = None
    stop_pod_sandbox: PodHandler | None = None
    remove_pod_sandbox: PodHandler | None = None
    create_container: CreateContainerHandler | None = None
    on_disconnect: Callable[[], Awaitable[None]] | None = None
    requested_timeout_ms: Callable[[], int] = lambda: NO_TIMEOUT_REQUEST

    def pod_handler(self, event: int) -> PodHandler | RunPodHandler | None:
        """The handler of a pod event (StateChange names it by number), None if not handled."""
        if event == nri_pb2.RUN_POD_SANDBOX:
            return self.run_pod_sandbox
        if event == nri_pb2.STOP_POD_SANDBOX:
            return self.stop_pod_sandbox
        if event == nri_pb2.REMOVE_POD_SANDBOX:
            return self.remove_pod_sandbox
        return None

    def events(self) -> list[int]:
        """The events to subscribe to: those with a handler."""
        pod_events = (nri_pb2.RUN_POD_SANDBOX, nri_pb2.STOP_POD_SANDBOX, nri_pb2.REMOVE_POD_SANDBOX)
        events: list[int] = [event for event in pod_events if self.pod_handler(event) is not None]
        if self.create_container is not None:
            events.append(nri_pb2.CREATE_CONTAINER)
        return events


def handlers_of(plugin: object) -> Handlers:
    """The handlers `plugin` implements (a Handlers is taken as it is)."""
    if isinstance(plugin, Handlers):
        return plugin
    return Handlers(
        configure=plugin.configure if isinstance(plugin, Configures) else None,
        synchronize=plugin.synchronize if isinstance(plugin, Synchronizes) else None,
        shutdown=plugin.shutdown if isinstance(plugin, ShutsDown) else None,
        run_pod_sandbox=plugin.run_pod_sandbox if isinstance(plugin, RunsPods) else None,
        stop_pod_sandbox=plugin.stop_pod_sandbox if isinstance(plugin, StopsPods) else None,
        remove_pod_sandbox=plugin.remove_pod_sandbox if isinstance(plugin, RemovesPods) else None,
        create_container=plugin.create_container if isinstance(plugin, CreatesContainers) else None,
        on_disconnect=plugin.on_disconnect if isinstance(plugin, HearsDisconnects) else None,
        **({"requested_timeout_ms": _timeout_of(plugin)} if isinstance(plugin, AsksTimeout) else {}),
    )


def _timeout_of(plugin: AsksTimeout) -> Callable[[], int]:
    def requested() -> int:  # read when the runtime configures the plugin, not before
        value = plugin.requested_timeout_ms
        return int(value() if callable(value) else value)

    return requested
