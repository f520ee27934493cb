"""The plugin side of nri.pkg.api.v1alpha1.Plugin: runtime requests → the plugin's methods.

The plugin's handlers are declared in nri_cni/nri/handlers.py (`Handlers`, each implemented or
not, found once by `handlers_of`); a request without a handler gets the default answer. The pod
events subscribed to are the ones with a handler. One PluginService serves one connection:
Synchronize pages collect in it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from nri_cni.api import nri_pb2
from nri_cni.errors import GrpcCode, ProtocolError
from nri_cni.nri.handlers import Handlers, handlers_of
from nri_cni.safety import validate
from nri_cni.ttrpc.server import Handler

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=Message)

PLUGIN_SERVICE = nri_pb2.DESCRIPTOR.services_by_name["Plugin"].full_name
RUNTIME_SERVICE = nri_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name

# Event → the name of its handler (for messages).
POD_EVENT_NAMES: dict[int, str] = {
    nri_pb2.RUN_POD_SANDBOX: "RunPodSandbox",
    nri_pb2.STOP_POD_SANDBOX: "StopPodSandbox",
    nri_pb2.REMOVE_POD_SANDBOX: "RemovePodSandbox",
}


def event_mask(events: list[int]) -> int:
    """ConfigureResponse.events: bit (event - 1) per subscribed event."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


def subscribed_events(plugin: object) -> list[int]:
    return handlers_of(plugin).events()


def _decode(cls: type[_M], payload: bytes) -> _M:
    try:
        return cls.FromString(payload)
    except DecodeError as exc:
        raise ProtocolError(
            f"undecodable {cls.__name__}", details=str(exc), grpc_code=GrpcCode.INVALID_ARGUMENT
        ) from None


def requested_timeout_ms(plugin: object) -> int:
    return handlers_of(plugin).requested_timeout_ms()


class PluginService:
    def __init__(
        self,
        plugin: Handlers | object,
        *,
        on_configured: Callable[[nri_pb2.ConfigureRequest], None],
        on_synchronized: Callable[[], None],
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        """observe(method, seconds): each request answered (or failed), how long the runtime
        waited; a StateChange is named for the pod event it carries."""
        self._plugin = handlers_of(plugin)
        self._observe = observe
        self._on_configured = on_configured
        self._on_synchronized = on_synchronized
        self._sync_pods: list[nri_pb2.PodSandbox] = []
        self._sync_containers: list[nri_pb2.Container] = []

    def handlers(self) -> dict[str, Handler]:
        table: dict[str, Handler] = {
            "Configure": self.configure,
            "Synchronize": self.synchronize,
            "Shutdown": self.shutdown,
            "RunPodSandbox": self.run_pod_sandbox,
            "StopPodSandbox": self.stop_pod_sandbox,
            "RemovePodSandbox": self.remove_pod_sandbox,
            "CreateContainer": self.create_container,
            "StateChange": self.state_change,
        }
        if self._observe is None:
            return table
        return {name: self._timed(name, handler) for name, handler in table.items()}

    def _timed(self, name: str, handler: Handler) -> Handler:
        observe = self._observe
        assert observe is not None

        async def timed(payload: bytes) -> bytes:
            t0 = time.perf_counter()
            try:
                return await handler(payload)
            finally:
                observe(_event_name(payload) if name == "StateChange" else name, time.perf_counter() - t0)

        return timed

    async def configure(self, payload: bytes) -> bytes:
        req = _decode(nri_pb2.ConfigureRequest, payload)
        if self._plugin.configure is not None:
            await self._plugin.configure(req)
        self._on_configured(req)
        return nri_pb2.ConfigureResponse(
            events=event_mask(self._plugin.events()),
            request_timeout=self._plugin.requested_timeout_ms(),
        ).SerializeToString()

    async def synchronize(self, payload: bytes) -> bytes:
        req = _decode(nri_pb2.SynchronizeRequest, payload)
        for pod in req.pods:
            # a pod whose id could name a path is left out: nri-cni never attached it
            if validate.is_valid_id(pod.id):
                self._sync_pods.append(pod)
            else:
                log.error("Synchronize: pod with invalid id %s left out", validate.quote_whole(pod.id))
        self._sync_containers.extend(req.containers)
        if req.more:  # the runtime wants more=true and no updates until the last page
            return nri_pb2.SynchronizeResponse(more=True).SerializeToString()
        pods, self._sync_pods = self._sync_pods, []
        containers, self._sync_containers = self._sync_containers, []
        if self._plugin.synchronize is not None:
            await self._plugin.synchronize(pods, containers)
        self._on_synchronized()
        return nri_pb2.SynchronizeResponse().SerializeToString()

    async def shutdown(self, payload: bytes) -> bytes:
        if self._plugin.shutdown is not None:
            await self._plugin.shutdown()
        return b""  # Empty

    async def run_pod_sandbox(self, payload: bytes) -> bytes:
        pod = _decode(nri_pb2.RunPodSandboxRequest, payload).pod
        _check_pod("RunPodSandbox", pod, whole=True)
        resp = None
        if self._plugin.run_pod_sandbox is not None:
            resp = await self._plugin.run_pod_sandbox(pod)
        return resp.SerializeToString() if resp is not None else b""

    async def stop_pod_sandbox(self, payload: bytes) -> bytes:
        await self._pod_event(nri_pb2.STOP_POD_SANDBOX, _decode(nri_pb2.StopPodSandboxRequest, payload).pod)
        return b""  # StopPodSandboxResponse is empty

    async def remove_pod_sandbox(self, payload: bytes) -> bytes:
        await self._pod_event(
            nri_pb2.REMOVE_POD_SANDBOX, _decode(nri_pb2.RemovePodSandboxRequest, payload).pod
        )
        return b""

    async def create_container(self, payload: bytes) -> bytes:
        """CreateContainer: the plugin's adjustment, or none (an empty answer changes nothing)."""
        req = _decode(nri_pb2.CreateContainerRequest, payload)
        if self._plugin.create_container is None:
            return b""
        if not validate.is_valid_id(req.pod.id):  # never fails the container: no adjustment
            log.error(
                "CreateContainer: pod id %s is not valid: no adjustment", validate.quote_whole(req.pod.id)
            )
            return b""
        resp = await self._plugin.create_container(req.pod, req.container)
        return resp.SerializeToString() if resp is not None else b""

    async def state_change(self, payload: bytes) -> bytes:
        """The deprecated catch-all (what containerd 2.1 sends). Other events: answered OK."""
        evt = _decode(nri_pb2.StateChangeEvent, payload)
        resp = await self._pod_event(evt.event, evt.pod)
        if resp is not None and resp.HasField("adjust"):
            log.debug(
                "pod %s/%s: StateChange cannot carry the network result back", evt.pod.namespace, evt.pod.name
            )
        return b""  # Empty

    async def _pod_event(self, event: int, pod: nri_pb2.PodSandbox) -> Any:
        handler = self._plugin.pod_handler(event)
        if handler is None:
            return None
        # a new pod must be wholly valid; stop/remove need only a valid id to clean it up
        _check_pod(POD_EVENT_NAMES[event], pod, whole=event == nri_pb2.RUN_POD_SANDBOX)
        return await handler(pod)


def _event_name(payload: bytes) -> str:
    """The pod event a StateChange carries, as its own method's name ("StateChange" for others)."""
    try:
        return POD_EVENT_NAMES.get(nri_pb2.StateChangeEvent.FromString(payload).event, "StateChange")
    except DecodeError:
        return "StateChange"


def _check_pod(event: str, pod: nri_pb2.PodSandbox, *, whole: bool) -> None:
    """Refuses (INVALID_ARGUMENT) a pod event whose id, or for a new pod whose name, namespace or
    uid, could reach a path or break CNI_ARGS; the id is logged whole, escaped."""
    try:
        if whole:
            validate.check_pod(pod.id, pod.name, pod.namespace, pod.uid, event)
        else:
            validate.check_id(pod.id, f"{event} pod id")
    except validate.InvalidInput as exc:
        log.error("%s refused: pod id %s: %s", event, validate.quote_whole(pod.id), exc)
        raise
