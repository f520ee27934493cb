"""`nri-cni run`: one daemon, three ways in.

It wires the parts together and owns the little state that is not in the CNI cache: the pods the
runtime has (from Synchronize and the pod events), each network's STATUS, and the timers (GC,
STATUS, repair, the netns reaper). Start-up order: roll back interrupted ADDs (intent records),
open the local socket (the shim may call as soon as the runtime starts pods), then connect to the
runtime.

Which pods are valid for GC (docs/reliability.md, section 2): the runtime's pod list (the last
Synchronize plus the pod events since), the pods with an operation in flight, and, while their
netns exists, the pods the runtime has not listed yet or for the first time: attached since the
previous Synchronize (a runtime stores a new pod only after its CNI ADD or NRI RunPodSandbox
returned, so a Synchronize in between does not list it), or had by the runtime before and
missing from the last Synchronize only (containerd leaves a pod whose state it cannot tell yet
out of its NRI list). Missing from two Synchronizes in a row, or its netns gone, or removed by a
pod event: garbage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time

from nri_cni import podreport
from nri_cni.cni.cache import ResultCache
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config
from nri_cni.daemon.local_server import LocalServer
from nri_cni.daemon.nri_handlers import NriHandlers
from nri_cni.daemon.reload import ConfigReloader
from nri_cni.errors import CniCode, CNIError, NriCniError
from nri_cni.lifecycle import NetworkLifecycle, RecordStore, VerbRunner, cache_counter
from nri_cni.metrics import Metrics
from nri_cni.nri.stub import Stub
from nri_cni.pod.hooks import PluginHooks
from nri_cni.pod.model import PodInfo
from nri_cni.pod.plan import PodNetworker, netns_gone

log = logging.getLogger("nri_cni.daemon")


class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        hooks = PluginHooks()
        self.cni = CNIRuntime(
            list(cfg.cni.bin_dirs), cfg.cni.cache_dir, exec_timeout=cfg.cni.plugin_timeout, hooks=hooks
        )
        runtime_cache = ResultCache(cfg.cni.runtime_cache_dir) if cfg.mode == "secondary" else None
        self.networker = PodNetworker(cfg, self.cni, hooks=hooks, runtime_cache=runtime_cache)
        # Prometheus metrics: always collected (cheap), served only when metrics.listen is set.
        self.metrics = Metrics(attachments=lambda: len(self.networker.cached()))
        self.networker.on_operation = self.metrics.observe_operation
        self.networker.on_gc = self.metrics.observe_gc
        self.networker.on_attached = self.pod_attached
        self.networker.readiness = self.network_ready
        # INIT / DEINIT per network generation, and hot reload (docs/lifecycle.md)
        self.lifecycle = NetworkLifecycle(
            VerbRunner(self.cni),
            RecordStore(cfg.state_dir),
            cache_counter(self.cni.cache),
            retry_initial=cfg.lifecycle.retry_initial,
            retry_max=cfg.lifecycle.retry_max,
        )
        self.networker.lifecycle = self.lifecycle
        self.reloader = ConfigReloader(cfg, self.apply_config)
        self.handlers = NriHandlers(self)
        self.stub = Stub(
            self.handlers, name=cfg.nri.plugin_name, idx=cfg.nri.plugin_index, socket_path=cfg.nri.socket
        )
        self.local = LocalServer(self, cfg.daemon_socket)
        self.pods: dict[str, PodInfo] = {}  # the runtime's pods, as far as we know
        self.synced = False
        self.network_status: dict[str, str] = {}  # network -> "" (ready) or the STATUS error
        self._repair: dict[str, PodInfo] = {}
        # pods the runtime has not listed (yet, or any more) -> (the Synchronize count they
        # are counted from, their netns): valid while that is the last or the one before
        self._unconfirmed: dict[str, tuple[int, str]] = {}
        self._syncs = 0
        self._background: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self.started = time.time()

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serves until SIGTERM/SIGINT (or stop()). An embedding test passes
        handle_signals=False: asyncio's signal wakeup fd is inherited by anything the process
        forks (pyroute2 forks for netns queries), and such a child's own SIGTERM would read
        as ours."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stopping.set)
            loop.add_signal_handler(signal.SIGHUP, self.reloader.trigger)
        recovered = await self.networker.recover_intents()
        if recovered:
            log.warning("rolled back %d interrupted ADD(s) at start-up", recovered)
        # after the rollbacks (their DELs count as attachments gone), before any ADD
        await self.lifecycle.start(n.conflist for n in self.cfg.networks)
        await self.reloader.start()
        await self.local.start()
        if self.cfg.metrics_listen:
            await self.metrics.serve(self.cfg.metrics_listen)
        await self.refresh_status()
        stub_task = asyncio.create_task(self.stub.run(), name="nri-stub")
        timers = [
            asyncio.create_task(self._every(self.cfg.status_interval, self.refresh_status)),
            asyncio.create_task(self._every(self.cfg.status_interval, self.reap)),
            asyncio.create_task(self._every(self.cfg.gc_interval, self._timed_gc)),
            asyncio.create_task(self._notify_ready()),
        ]
        log.info(
            "nri-cni running in %s mode: %d network(s), NRI socket %s, local socket %s",
            self.cfg.mode,
            len(self.cfg.networks),
            self.cfg.nri.socket,
            self.cfg.daemon_socket,
        )
        stop_wait = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait({stub_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if stub_task in done and stub_task.exception():
            log.error("NRI connection ended: %s", stub_task.exception())
        log.info("stopping")
        await self.stub.stop()
        for task in [*timers, stub_task, stop_wait, *self._background]:
            task.cancel()
        await asyncio.gather(*timers, stub_task, stop_wait, *self._background, return_exceptions=True)
        await self.reloader.close()
        await self.lifecycle.close()
        await self.local.close()
        await self.metrics.close()
        await asyncio.to_thread(self.cni.cache.flush)  # the last ADDs' cache entries on disk

    def stop(self) -> None:
        self._stopping.set()

    async def apply_config(self, cfg: Config) -> None:
        """A hot reload the reloader validated (docs/lifecycle.md): the next pod operation uses
        it; attachments keep their cached config; new generations get INIT, gone ones DEINIT."""
        if cfg.log_level != self.cfg.log_level:
            logging.getLogger().setLevel(cfg.log_level.upper())
        self.cfg = cfg
        self.networker.reconfigure(cfg)
        self.lifecycle.update(n.conflist for n in cfg.networks)
        for name in set(self.network_status) - {n.name for n in cfg.networks}:
            del self.network_status[name]
        await self.refresh_status()

    async def _every(self, interval: float, job) -> None:
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:
                log.exception("periodic %s failed", getattr(job, "__name__", job))

    async def _notify_ready(self) -> None:
        """systemd Type=notify: READY once registered with the runtime and synchronized."""
        await self.stub.synchronized.wait()
        sd_notify("READY=1\nSTATUS=registered and synchronized")

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- pods --------------------------------------------------------------------------------

    def pod_seen(self, pod: PodInfo) -> None:
        """The runtime told us about the pod (an NRI pod event). Not yet a confirmation: the
        runtime stores the pod only after the event, so a Synchronize may still miss it."""
        self.pods[pod.id] = pod

    def pod_attached(self, pod: PodInfo) -> None:
        """An ADD for the pod finished; the runtime lists the pod only later (and a
        Synchronize that comes first must not make it garbage)."""
        self._unconfirmed[pod.id] = (self._syncs, pod.netns)

    def pod_detached(self, pod_id: str) -> None:
        self._unconfirmed.pop(pod_id, None)

    def pod_gone(self, pod_id: str) -> None:
        self.pods.pop(pod_id, None)
        self._repair.pop(pod_id, None)
        self._unconfirmed.pop(pod_id, None)

    def needs_repair(self, pod: PodInfo) -> None:
        self._repair[pod.id] = pod

    def pods_in_flight(self) -> set[str]:
        return set(self.networker.locks._pod_locks)

    def unconfirmed_valid(self) -> set[str]:
        """Pods not listed by the runtime that are still given the benefit of the doubt: not
        yet listed since their attach, or missing from the last Synchronize only, while their
        netns exists. (An entry goes when the pod is listed, detached, gone or collected.)"""
        return {
            pod_id
            for pod_id, (since, netns) in self._unconfirmed.items()
            if self._syncs - since <= 1 and not netns_gone(netns)
        }

    def valid_pod_ids(self) -> set[str]:
        return set(self.pods) | self.pods_in_flight() | self.unconfirmed_valid()

    async def synchronized(self, pods: list[PodInfo]) -> None:
        """The runtime's full pod list (every (re)connection). Answered at once: GC and repair
        run afterwards, in the background, so Synchronize never outlives the runtime's timeout."""
        previous, self.pods = self.pods, {p.id: p for p in pods}
        self._syncs += 1
        for pod_id in self.pods:
            self._unconfirmed.pop(pod_id, None)
        # a pod the runtime had (listed, or an event) that this list misses gets until the next
        # one; a pod nri-cni never saw the runtime have (it was down) does not
        for pod_id, pod in previous.items():
            if pod_id not in self.pods and pod_id not in self._unconfirmed:
                self._unconfirmed[pod_id] = (self._syncs - 1, pod.netns)
        self.synced = True
        log.info("synchronized: the runtime has %d pod(s)", len(pods))
        self._spawn(self._after_sync(), "after-sync")

    async def _after_sync(self) -> None:
        await self.gc_now(reason="synchronize")
        if self.cfg.repair_on_sync:
            await self.repair()

    async def repair(self) -> None:
        """Attach what running pods lack (nri-cni was down when they started, or a failed
        attachment was kept for retry)."""
        if self.cfg.mode == "shim":
            candidates = list(self._repair.values())
        else:
            candidates = [p for p in self.pods.values() if p.netns]
        for pod in candidates:
            if pod.id not in self.pods or not pod.netns or not os.path.exists(pod.netns):
                self._repair.pop(pod.id, None)
                continue
            try:
                answer = await self.networker.attach(pod)
            except NriCniError as exc:
                log.error("repair of pod %s failed: %s", pod.label(), exc)
                self._repair[pod.id] = pod
                continue
            self._repair.pop(pod.id, None)
            if answer.attachments:
                log.debug("pod %s is fully attached", pod.label())

    async def _timed_gc(self) -> None:
        if self.synced and self.stub.synchronized.is_set():
            await self.gc_now(reason="timer")
        if self._repair:
            await self.repair()

    async def gc_now(self, reason: str) -> dict:
        if not self.synced:
            raise NriCniError(
                "no pod list from the runtime yet (not synchronized): GC would delete every attachment"
            )

        def valid() -> set[str]:  # evaluated once GC holds its lock
            ids = self.valid_pod_ids()
            log.info("gc (%s): %d valid pod(s)", reason, len(ids))
            return ids

        report = await self.networker.gc(valid)
        for name in report["deleted"]:
            self._unconfirmed.pop(name.split("/")[1], None)
        still_valid = self.unconfirmed_valid()
        if len(still_valid) < len(self._unconfirmed):  # forget the ones with nothing left
            attached = self.networker.attached_pod_ids()
            for pod_id in list(self._unconfirmed):
                if pod_id not in still_valid and pod_id not in attached:
                    del self._unconfirmed[pod_id]
        return report

    async def reap(self) -> None:
        """Detach pods whose netns the runtime removed without telling us (containerd 2.1.9
        sends no NRI stop/remove for pods that lived through its restart, containerd#8426)."""
        for pod_id in await self.networker.reap():
            # stopped (or removed) without an event: nothing more to do for it
            self.pod_gone(pod_id)

    # -- STATUS ------------------------------------------------------------------------------

    async def refresh_status(self) -> None:
        for spec in self.cfg.networks:
            await self._status_of(spec)

    async def _status_of(self, spec) -> str:
        try:
            await self.cni.status(spec.conflist)
            error = ""
        except NriCniError as exc:
            error = str(exc)
        if error != self.network_status.get(spec.name):
            if error:
                log.error("network %s is not ready: %s", spec.name, error)
            else:
                log.info("network %s is ready", spec.name)
        self.network_status[spec.name] = error
        return error

    async def network_ready(self, name: str) -> str:
        """ "" when the network is ready, else its STATUS error (status.refuse_when_not_ready).
        A network last seen failing is asked again first: a recovered one must not go on
        refusing pods until the next status.interval."""
        if not self.network_status.get(name):
            return ""
        spec = self.cfg.network(name)
        return await self._status_of(spec) if spec is not None else ""

    def check_ready(self) -> None:
        failing = {n: e for n, e in self.network_status.items() if e}
        failing.update(self.lifecycle.not_ready())  # INIT failed: no ADD can succeed
        if failing:
            name, error = next(iter(failing.items()))
            raise CNIError(CniCode.PLUGIN_NOT_AVAILABLE, f"network {name!r} is not ready", details=error)

    # -- reports (CLI) -----------------------------------------------------------------------

    def status_report(self) -> dict:
        # not ready: STATUS fails, or INIT failed (docs/lifecycle.md)
        errors = {**{n: e for n, e in self.network_status.items() if e}, **self.lifecycle.not_ready()}
        return {
            "mode": self.cfg.mode,
            "ready": self.stub.synchronized.is_set() and not errors,
            "nri": {
                "socket": self.cfg.nri.socket,
                "registered": self.stub.registered.is_set(),
                "synchronized": self.stub.synchronized.is_set(),
                "runtime": f"{self.stub.runtime_name} {self.stub.runtime_version}".strip(),
                "requestTimeoutMs": self.stub.request_timeout_ms,
            },
            "networks": {
                n.name: {"ready": n.name not in errors, "error": errors.get(n.name, ""), "default": n.default}
                for n in self.cfg.networks
            },
            "pods": len(self.pods),
            "attachments": len(self.networker.cached()),
            "pendingRepair": sorted(self._repair),
            "pendingRollback": self.networker.pending_rollbacks(),
            "unconfirmed": len(self._unconfirmed),
            # what the daemon keeps per pod besides the cache: all zero on an idle, empty node
            "tracked": {
                "pods": len(self.pods),
                "operations": len(self.networker.locks),
                "unconfirmed": len(self._unconfirmed),
                "repair": len(self._repair),
                "hooks": len(self.networker.hooks) if self.networker.hooks else 0,
                "background": len(self._background),
            },
            "uptimeSeconds": round(time.time() - self.started, 1),
            "lifecycle": self.lifecycle.report(),
            "reload": self.reloader.report(),
        }

    def pods_report(self) -> list[dict]:
        runtime = self.networker.runtime_cache if self.cfg.mode == "secondary" else None
        return podreport.pods_report(
            self.networker.cached(),
            podreport.PodState(self.pods, set(self._repair), set(self.networker.pending_rollbacks())),
            runtime_entries=podreport.runtime_primaries(runtime, self.cfg.primary_network),
            names={n.name: n.nad for n in self.cfg.networks if n.nad},
        )


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
