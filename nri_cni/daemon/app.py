"""`nri-cni run`: the composition root. build_daemon(cfg) constructs every part in dependency
order, each given its collaborators; Daemon.run() starts them as one ordered stack and stops
them in reverse, only the ones that started.

    CNIRuntime -> Metrics, NetworkLifecycle -> NetworkReadiness -> PodPlan -> PodService
      -> NriHandlers -> Stub (NRI)      -> LocalServer (shim, CLI)      -> timers

Start-up order: roll back interrupted ADDs (intent records), INIT the networks, watch the
config, open the local socket (the shim may call as soon as the runtime starts pods), serve
metrics, then connect to the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from nri_cni.cni.cache import ResultCache
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config, ConfigSource
from nri_cni.daemon.containers import ContainerNetworks, OperationTee, PodEntries
from nri_cni.daemon.cycles import CycleCollector
from nri_cni.daemon.local_server import LocalServer
from nri_cni.daemon.nri_handlers import NriHandlers
from nri_cni.daemon.reload import ConfigReloader
from nri_cni.daemon.reports import DaemonReports
from nri_cni.lifecycle import NetworkLifecycle, RecordStore, VerbRunner, cache_counter
from nri_cni.metrics.endpoint import Metrics
from nri_cni.metrics.limits import BackgroundValue
from nri_cni.node import NodeInspector
from nri_cni.nri.stub import Stub
from nri_cni.pod.finalized import FinalizedMarks
from nri_cni.pod.intents import IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.plan import PodPlan
from nri_cni.safety import files
from nri_cni.service.modes import mode_in_force
from nri_cni.service.podstate import HealthBook
from nri_cni.service.readiness import NetworkReadiness
from nri_cni.service.roster import Roster
from nri_cni.service.service import PodService

log = logging.getLogger("nri_cni.daemon")

DEFAULT_NRI_DEADLINE = 2.0  # containerd's and CRI-O's plugin request timeout, when neither side said one
RESYNC_EVERY = 10.0  # seconds between two reconnects for a fresh pod list, at least


class ConfigApplier:
    """A hot reload the reloader validated (docs/lifecycle.md): the next pod operation uses
    it; attachments keep their cached config; new generations get INIT, gone ones DEINIT."""

    def __init__(
        self, *, source: ConfigSource, lifecycle: NetworkLifecycle, readiness: NetworkReadiness
    ) -> None:
        self.source = source
        self.lifecycle = lifecycle
        self.readiness = readiness

    async def apply(self, cfg: Config) -> None:
        """The one place a reload lands: every part reads the new config from the source."""
        if cfg.log_level != self.source.current.log_level:
            logging.getLogger().setLevel(cfg.log_level.upper())
        self.source.replace(cfg)
        self.lifecycle.update(n.conflist for n in cfg.networks)
        self.readiness.forget_gone()
        await self.readiness.refresh()


@dataclass
class Daemon:
    cni: CNIRuntime
    metrics: Metrics
    lifecycle: NetworkLifecycle
    readiness: NetworkReadiness
    pods: PodService
    handlers: NriHandlers
    stub: Stub
    reloader: ConfigReloader
    local: LocalServer
    reports: DaemonReports

    def __post_init__(self) -> None:
        self._stopping = asyncio.Event()

    @property
    def cfg(self) -> Config:
        """The running configuration (a hot reload replaces it)."""
        return self.pods.cfg

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serves until SIGTERM/SIGINT (or stop()). An embedding test passes
        handle_signals=False: asyncio's signal wakeup fd is inherited by anything the process
        forks (pyroute2 forks for netns queries), and such a child's own SIGTERM would read
        as ours."""
        files.restrict_umask()  # before any dir, file or socket is made
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stopping.set)
            loop.add_signal_handler(signal.SIGHUP, self.reloader.trigger)
        cfg = self.cfg
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self.pods.plan.intents.close)  # its file made ahead, its cleared records
            stack.callback(self.cni.cache.close)  # entries deleted, their unlink due
            stack.push_async_callback(asyncio.to_thread, self.cni.cache.flush)  # the last ADDs' entries
            recovered = await self.pods.timers.recover()  # before anything serves
            if recovered:
                log.warning("rolled back %d interrupted ADD(s) at start-up", recovered)
            # after the rollbacks (their DELs count as attachments gone), before any ADD
            await stack.enter_async_context(
                _started(self.lifecycle.start(n.conflist for n in cfg.networks), self.lifecycle.close)
            )
            await stack.enter_async_context(_started(self.reloader.start(), self.reloader.close))
            await stack.enter_async_context(_started(self.local.start(), self.local.close))
            if cfg.metrics_listen:
                await stack.enter_async_context(
                    _started(self.metrics.serve(cfg.metrics_listen, cfg.metrics_server), self.metrics.close)
                )
            stack.push_async_callback(self.pods.close)  # GC and repair after a Synchronize
            await self.readiness.refresh()
            await stack.enter_async_context(self._timers(cfg))
            stub_task = await stack.enter_async_context(self._connected())
            log.info(
                "nri-cni running in %s mode: %d network(s), NRI socket %s, local socket %s",
                self.pods.mode.name,
                len(cfg.networks),
                cfg.nri.socket,
                cfg.daemon_socket,
            )
            stop_wait = asyncio.create_task(self._stopping.wait())
            try:
                await asyncio.wait({stub_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
            if stub_task.done() and not stub_task.cancelled() and stub_task.exception():
                log.error("NRI connection ended: %s", stub_task.exception())
            log.info("stopping")

    def stop(self) -> None:
        self._stopping.set()

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[asyncio.Task[None]]:
        """The NRI connection (reconnecting), for as long as the daemon runs."""
        task = asyncio.create_task(self.stub.run(), name="nri-stub")
        try:
            yield task
        finally:
            await self.stub.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _timers(self, cfg: Config) -> AsyncIterator[None]:
        """STATUS, the netns reaper, GC (with the repair retries), verify, systemd's READY."""

        async def upkeep() -> None:
            await self.pods.timers.upkeep(runtime_connected=self.stub.synchronized.is_set())

        async def verify() -> None:
            await self.pods.timers.verify_tick(runtime_connected=self.stub.synchronized.is_set())

        # repair: off switches the verify timer off (verify on demand still reports)
        verify_interval = cfg.verify_interval if cfg.repair != "off" else 0.0

        async def resync() -> None:
            """A stale roster (service/verbs.py): a fresh pod list, at most every RESYNC_EVERY."""
            while True:
                await self.pods.verbs.roster_stale.wait()
                self.pods.verbs.roster_stale.clear()
                self.stub.resync()
                await asyncio.sleep(RESYNC_EVERY)

        tasks = [
            asyncio.create_task(resync()),
            asyncio.create_task(_every(verify_interval, verify)),
            asyncio.create_task(_every(cfg.status_interval, self.readiness.refresh)),
            asyncio.create_task(_every(cfg.status_interval, self.pods.timers.reap)),
            asyncio.create_task(_every(cfg.gc_interval, upkeep)),
            asyncio.create_task(self._notify_ready()),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _notify_ready(self) -> None:
        """systemd Type=notify: READY once registered with the runtime and synchronized."""
        await self.stub.synchronized.wait()
        sd_notify("READY=1\nSTATUS=registered and synchronized")


def build_daemon(cfg: Config) -> Daemon:
    """Every part of `nri-cni run`, constructed in dependency order; nothing is started, and
    nothing is set on a part after it is built. The config in force is one ConfigSource every
    part reads (a hot reload replaces it there); the mode is derived from it once per config."""
    source = ConfigSource(cfg)
    health = HealthBook()  # each pod's verdict: the pod service writes it, reports and metrics read
    cni = CNIRuntime(
        list(cfg.cni.bin_dirs),
        cache=ResultCache(cfg.cni.cache_dir, remove_soon=True),
        exec_timeout=cfg.cni.plugin_timeout,
        pass_env=cfg.cni.plugin_env,
        executor=PluginExecutor(trust_files=cfg.trust_files),
    )
    # Prometheus metrics: always collected (cheap), served only when metrics.listen is set.
    # the count reads every cache file: refreshed off the loop, not per scrape
    metrics = Metrics(
        attachments=BackgroundValue(lambda: len(cni.cache.entries())),
        pod_states=health.counts,  # nri_cni_pods{state}, read at every scrape
    )
    # INIT / DEINIT per network generation, and hot reload (docs/lifecycle.md)
    lifecycle = NetworkLifecycle(
        VerbRunner(cni),
        RecordStore(cfg.state_dir),
        cache_counter(cni.cache),
        retry_initial=cfg.lifecycle.retry_initial,
        retry_max=cfg.lifecycle.retry_max,
    )
    readiness = NetworkReadiness(source, cni, lifecycle)
    # what a container learns of its pod's networks (NRI CreateContainer, docs/containers.md);
    # its status files follow the pod's operations beside the metrics
    containers = ContainerNetworks(
        source,
        PodEntries(
            own=lambda pod_id: cni.cache.entries(container_id=pod_id),
            runtime=lambda pod_id: [
                e for e in mode_in_force(source).runtime_attachments() if e.container_id == pod_id
            ],
        ),
        count_refusal=metrics.count_container_refusal,
    )
    # the pods' own netns pool (the answer's MAC and MTU, a CHECK answered from the records),
    # apart from the verify rounds': a pod never waits behind a round's reads
    pod_inspector = NodeInspector.with_workers()
    plan = PodPlan(
        source,
        cni,
        intents=IntentStore(cfg.state_dir, remove_soon=True),  # state_dir is read at start-up only
        finalized=FinalizedMarks(cfg.state_dir),
        sink=OperationTee(metrics, containers),
        inspector=pod_inspector,
        readiness=readiness,
        lifecycle=lifecycle,
    )
    pods = PodService(
        source,
        plan=plan,
        roster=Roster(),
        locks=PodLocks(),
        health=health,
        inspector=NodeInspector.with_workers(),
        pod_inspector=pod_inspector,
    )
    handlers = NriHandlers(pods, containers, request_timeout=cfg.nri.request_timeout)

    def observe_nri(method: str, seconds: float) -> None:
        # the deadline the runtime said (Configure), else the one asked for, else containerd's 2 s
        deadline = stub.request_timeout_ms / 1000 or cfg.nri.request_timeout or DEFAULT_NRI_DEADLINE
        metrics.observe_nri_request(method, seconds, deadline)

    stub = Stub(
        handlers,
        name=cfg.nri.plugin_name,
        idx=cfg.nri.plugin_index,
        socket_path=cfg.nri.socket,
        observe_request=observe_nri,
    )
    applier = ConfigApplier(source=source, lifecycle=lifecycle, readiness=readiness)
    reloader = ConfigReloader(cfg, applier.apply)
    reports = DaemonReports(pods=pods, readiness=readiness, lifecycle=lifecycle, reloader=reloader, stub=stub)
    local = LocalServer(
        cfg.daemon_socket,
        pods=pods,
        readiness=readiness,
        reports=reports,
        observe_shim=metrics.observe_shim_request,
        closed=CycleCollector().connection_closed,
    )
    return Daemon(
        cni=cni,
        metrics=metrics,
        lifecycle=lifecycle,
        readiness=readiness,
        pods=pods,
        handlers=handlers,
        stub=stub,
        reloader=reloader,
        local=local,
        reports=reports,
    )


@contextlib.asynccontextmanager
async def _started(start: Awaitable[object], stop: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """A part as a stack entry: stopped on the way out only if it started."""
    await start
    try:
        yield
    finally:
        await stop()


async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
    if interval <= 0:
        return
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("periodic %s failed", getattr(job, "__name__", job))


def sd_notify(message: str) -> None:
    """The systemd notify protocol: one datagram to $NOTIFY_SOCKET (abstract if it starts with @)."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), path)
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", path, exc)
