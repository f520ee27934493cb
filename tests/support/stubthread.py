"""Run nri_cni's NRI Stub in a background thread (its own asyncio loop) next to blocking CRI
calls, with a plugin that records what the runtime sends."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nri_cni.api import nri_pb2
from nri_cni.daemon.nri_answer import pod_info
from tests.support.nri_runtime import STOP, TEARDOWN, RuntimeKind, pod_at_event

T = TypeVar("T")


@dataclass(frozen=True)
class PodRecord:
    id: str
    name: str
    namespace: str
    uid: str
    netns: str  # "" when the pod carries no network namespace path
    netns_exists: bool  # whether that path existed when the event arrived
    ips: tuple[str, ...]
    pid: int


def pod_record(pod: Any) -> PodRecord:
    """The fields the tests look at, from an nri_cni.api PodSandbox (read as the daemon reads
    an NRI event: nri_cni/daemon/nri_answer.py's pod_info)."""
    info = pod_info(pod)
    return PodRecord(
        id=info.id,
        name=info.name,
        namespace=info.namespace,
        uid=info.uid,
        netns=info.netns,
        netns_exists=bool(info.netns) and os.path.exists(info.netns),
        ips=tuple(pod.ips),
        pid=pod.pid,
    )


def observed_stop_steps(stop: PodRecord) -> tuple[str, ...]:
    """The order of a real runtime's StopPodSandbox, as nri_runtime.stop_steps names it, read
    from the STOP event: a netns already gone means the runtime's teardown came first."""
    return (TEARDOWN, STOP) if stop.netns and not stop.netns_exists else (STOP, TEARDOWN)


def double_netns(kind: RuntimeKind, event: int, netns: str) -> str:
    """The netns path the NRI double of `kind` sends in `event` for a pod whose netns is `netns`."""
    pod = nri_pb2.PodSandbox(
        linux=nri_pb2.LinuxPodSandbox(namespaces=[nri_pb2.LinuxNamespace(type="network", path=netns)])
    )
    return pod_record(pod_at_event(kind, event, pod)).netns


class Recorder:
    """An NRI plugin that remembers every call; tests wait on it from another thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.configures: list[dict[str, Any]] = []
        self.syncs: list[list[PodRecord]] = []
        self.events: list[tuple[str, PodRecord]] = []
        self.disconnects = 0

    def _add(self, fn: Callable[[], None]) -> None:
        with self._cond:
            fn()
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0) -> T:
        with self._cond:
            result = self._cond.wait_for(predicate, timeout)
        if not result:
            raise AssertionError(
                f"timed out after {timeout}s; recorded: configures="
                f"{len(self.configures)} syncs={self.syncs} "
                f"events={self.events} disconnects={self.disconnects}"
            )
        return result

    def events_for(self, pod_id: str) -> list[tuple[str, PodRecord]]:
        with self._cond:
            return [(kind, rec) for kind, rec in self.events if rec.id == pod_id]

    # -- the plugin interface ------------------------------------------------------------------

    async def configure(self, req: Any) -> None:
        self._add(
            lambda: self.configures.append(
                {
                    "runtime_name": req.runtime_name,
                    "runtime_version": req.runtime_version,
                    "registration_timeout": req.registration_timeout,
                    "request_timeout": req.request_timeout,
                }
            )
        )

    async def synchronize(self, pods: list[Any], containers: list[Any]) -> None:
        self._add(lambda: self.syncs.append([pod_record(p) for p in pods]))

    async def run_pod_sandbox(self, pod: Any) -> None:
        self._add(lambda: self.events.append(("run", pod_record(pod))))

    async def stop_pod_sandbox(self, pod: Any) -> None:
        self._add(lambda: self.events.append(("stop", pod_record(pod))))

    async def remove_pod_sandbox(self, pod: Any) -> None:
        self._add(lambda: self.events.append(("remove", pod_record(pod))))

    async def on_disconnect(self) -> None:
        def bump() -> None:
            self.disconnects += 1

        self._add(bump)


class StubThread:
    """nri_cni.nri.stub.Stub running ``run()`` in a thread of its own until ``stop()``."""

    def __init__(self, plugin: Any, *, name: str, idx: str, socket_path: str, **stub_kwargs: Any) -> None:
        self.plugin = plugin
        self._args = dict(name=name, idx=idx, socket_path=socket_path, **stub_kwargs)
        self.loop = asyncio.new_event_loop()
        self.stub: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"nri-stub-{name}", daemon=True)

    def start(self) -> StubThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub thread did not start")
        if self.error is not None:
            raise self.error
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._run())
        except BaseException as exc:  # reported by start() / stop()
            self.error = exc
            self._ready.set()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _run(self) -> None:
        from nri_cni.nri.stub import Stub

        self.stub = Stub(self.plugin, **self._args)
        self._ready.set()
        await self.stub.run()

    def call(self, coro_fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``coro_fn()`` on the stub's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout)

    def wait_synchronized(self, timeout: float = 10.0) -> float:
        """Wait until the stub is registered and synchronized; returns the seconds waited."""
        t0 = time.monotonic()
        self.call(lambda: asyncio.wait_for(self.stub.synchronized.wait(), timeout), timeout + 1)
        return time.monotonic() - t0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive() and self.stub is not None:
            try:
                self.call(self.stub.stop, timeout)
            except RuntimeError:  # loop already closed
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("stub thread did not end")
        if self.error is not None:
            raise self.error
