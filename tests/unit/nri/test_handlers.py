"""The NRI plugin's handlers, declared (nri_cni/nri/handlers.py): found once per plugin, each
implemented or not; the events subscribed to and the timeout asked for follow from them."""

from __future__ import annotations

import asyncio

from nri_cni.api import nri_pb2
from nri_cni.nri.handlers import Handlers, handlers_of
from nri_cni.nri.plugin_service import PluginService, event_mask


class RunOnly:
    requested_timeout_ms = 9000

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def run_pod_sandbox(self, pod):
        self.runs.append(pod.id)


class Everything(RunOnly):
    def requested_timeout_ms(self) -> int:  # a method works too
        return 1234

    async def configure(self, req): ...

    async def synchronize(self, pods, containers): ...

    async def shutdown(self): ...

    async def stop_pod_sandbox(self, pod): ...

    async def remove_pod_sandbox(self, pod): ...

    async def on_disconnect(self): ...


def test_a_plugin_handles_what_it_implements_and_nothing_else():
    h = handlers_of(RunOnly())
    assert h.run_pod_sandbox is not None and h.events() == [nri_pb2.RUN_POD_SANDBOX]
    assert (
        h.configure,
        h.synchronize,
        h.shutdown,
        h.stop_pod_sandbox,
        h.remove_pod_sandbox,
        h.on_disconnect,
    ) == (None,) * 6
    assert h.requested_timeout_ms() == 9000
    full = handlers_of(Everything())
    assert full.events() == [nri_pb2.RUN_POD_SANDBOX, nri_pb2.STOP_POD_SANDBOX, nri_pb2.REMOVE_POD_SANDBOX]
    assert full.requested_timeout_ms() == 1234 and full.on_disconnect is not None
    none = handlers_of(object())
    assert none.events() == [] and none.requested_timeout_ms() == 0
    assert none == Handlers(requested_timeout_ms=none.requested_timeout_ms)
    assert handlers_of(full) is full  # declared ones are taken as they are


def test_the_service_answers_from_the_declared_handlers():
    plugin = RunOnly()
    service = PluginService(plugin, on_configured=lambda req: None, on_synchronized=lambda: None)
    resp = nri_pb2.ConfigureResponse.FromString(
        asyncio.run(service.configure(nri_pb2.ConfigureRequest().SerializeToString()))
    )
    assert resp.events == event_mask([nri_pb2.RUN_POD_SANDBOX]) and resp.request_timeout == 9000
    pod = nri_pb2.PodSandbox(id="a" * 64, name="p", namespace="ns", uid="u")
    stop = nri_pb2.StateChangeEvent(event=nri_pb2.STOP_POD_SANDBOX, pod=pod).SerializeToString()
    asyncio.run(service.state_change(stop))  # no handler: answered, nothing called
    run = nri_pb2.StateChangeEvent(event=nri_pb2.RUN_POD_SANDBOX, pod=pod).SerializeToString()
    asyncio.run(service.state_change(run))
    assert plugin.runs == [pod.id]
