"""What nri-cni does with each NRI pod event: the NRI side of the pod service.

| event  | native                      | shim                         | secondary                        |
|--------|-----------------------------|------------------------------|----------------------------------|
| run    | attach all, answer the IPs  | remember the pod (the shim   | attach the extra networks,       |
|        |                             | attached it already)         | FINALIZE all (primary included)  |
| stop   | detach (first of NRI stop and the runtime's CNI DEL does it; the other finds nothing)       |
| remove | detach again if needed (netns gone: DEL still runs so IPAM releases), forget the pod      |
| sync   | the runtime's pod list: GC everything else, repair pods missing an attachment              |
| create | a container of a pod with attachments: its networks as annotations, a file, sockets         |
|        | (daemon/containers.py; docs/containers.md)                                                |

Which column applies is the mode's answer (nri_cni/service/modes.py). A failed attach in
RunPodSandbox fails the pod (CRI-O: measured clean), except where the runtime would then leak
the sandbox (containerd before 2.2.6, containerd#13355): there the pod is kept, the error
logged, and the attachment retried by the repair loop. `failure_policy` in the config
overrides this.
"""

from __future__ import annotations

import asyncio
import logging
import re

from nri_cni.api import nri_pb2
from nri_cni.daemon.containers import ContainerNetworks
from nri_cni.daemon.nri_answer import container_response, pod_info, run_pod_response
from nri_cni.errors import NriCniError
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import Mode
from nri_cni.service.service import PodService
from nri_cni.ttrpc import request_deadline

log = logging.getLogger("nri_cni.nri")

# containerd fixed the sandbox leak after a failed NRI RunPodSandbox in 2.2.6. CRI-O has none
# (measured on 1.36.3, tests/e2e/test_crio_secondary.py): it sends STOP and REMOVE at once,
# rolls its own network back and keeps no sandbox, so `auto` fails the pod there.
_LEAKS_SANDBOX_BEFORE = {"containerd": (2, 2, 6)}


def runtime_fails_cleanly(runtime_name: str, runtime_version: str) -> bool:
    fixed_in = _LEAKS_SANDBOX_BEFORE.get(runtime_name)
    if fixed_in is None:
        return True
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", runtime_version)
    if not m:
        return False
    return tuple(int(x) for x in m.groups()) >= fixed_in


class NriHandlers:
    """The plugin object the NRI stub dispatches to."""

    def __init__(self, pods: PodService, containers: ContainerNetworks, *, request_timeout: float) -> None:
        """The mode and the failure policy are read from the pod service's config in force, so
        a reload reaches them too (one mode object for the handlers and the service)."""
        self.pods = pods
        self.containers = containers
        self.requested_timeout_ms = int(request_timeout * 1000)
        self.runtime_name = ""
        self.runtime_version = ""
        self.runtime_timeout = 0.0  # the runtime's NRI request timeout (Configure), seconds

    async def configure(self, req: nri_pb2.ConfigureRequest) -> None:
        self.runtime_name = req.runtime_name
        self.runtime_version = req.runtime_version
        self.runtime_timeout = req.request_timeout / 1000
        if req.config:
            log.info(
                "runtime-supplied plugin config ignored (%d bytes): nri-cni reads its own file",
                len(req.config),
            )

    async def synchronize(self, pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]) -> None:
        infos = [pod_info(p) for p in pods]
        for info in infos:
            log.info("Synchronize: pod %s id=%s netns=%s", info.label(), info.id, info.netns or "-")
        self.pods.timers.synchronized(infos)
        # a pod removed while nri-cni was down: its containers' status directory goes
        self.containers.retain({i.id for i in infos} | {e.container_id for e in self.pods.view.attachments()})

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> nri_pb2.RunPodSandboxResponse | None:
        info = _event("RunPodSandbox", pod)
        self.pods.verbs.seen(info)
        if not self.mode.attaches_on_run or info.host_network:
            return None
        try:
            # Past the runtime's request timeout the runtime gives up on us (and creates the
            # pod anyway); the attach goes on regardless (a shielded task), its state is kept,
            # and the Synchronize after the reconnect (GC, repair) makes the pod whole; in
            # native mode it is released at once (below): the runtime never got its IPs.
            answer = await self.pods.verbs.attach(info)
        except NriCniError as exc:
            if self._fail_pods():
                raise
            log.error(
                "%s; the pod is kept and the attachment retried (failing it would leak the sandbox on %s %s)",
                exc,
                self.runtime_name,
                self.runtime_version,
            )
            self.pods.verbs.attach_failed(info)
            return None
        if not self.mode.answers_run_pod:
            return None
        late = self._late()
        if late:
            await self.pods.verbs.missed(info, late)
            return None
        return run_pod_response(answer)

    def _late(self) -> str:
        """Why this RunPodSandbox's answer cannot reach the runtime in time ("" when it can):
        its deadline (the request's ttrpc timeout, else the one Configure gave) passed."""
        deadline = request_deadline()
        if deadline is None:
            return ""
        took = asyncio.get_running_loop().time() - deadline.received
        timeout = deadline.timeout or self.runtime_timeout
        if not deadline.expired and not (timeout and took >= timeout):
            return ""
        return (
            f"nri-cni's RunPodSandbox answer was ready {took:.1f} s after the request, past the "
            f"runtime's {timeout:g} s NRI request timeout: the runtime created the pod without its "
            "IPs, and nri-cni released what it had attached (raise the runtime's NRI "
            "plugin_request_timeout, or nri.request_timeout where the runtime honours it, or "
            "find what made the attach slow: nri-cni pods, the plugin timings in the log)"
        )

    @property
    def mode(self) -> Mode:
        return self.pods.mode

    def _fail_pods(self) -> bool:
        policy = self.pods.cfg.failure_policy  # "auto", "fail" or "keep"; a reload may change it
        if policy != "auto":
            return policy == "fail"
        return runtime_fails_cleanly(self.runtime_name, self.runtime_version)

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self.pods.verbs.detach(_event("StopPodSandbox", pod), stop_event=True)

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        try:
            await self.pods.verbs.remove(_event("RemovePodSandbox", pod))
        finally:
            self.containers.forget(pod.id)

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse | None:
        """Never fails the container: what cannot be given is left out and logged."""
        label = f"{pod.namespace}/{pod.name}"
        try:
            adjustment = self.containers.adjust(pod.id, label)
        except (OSError, ValueError, NriCniError) as exc:
            log.error(
                "CreateContainer: pod %s id=%s container %s: no adjustment: %s",
                label,
                pod.id,
                container.name,
                exc,
            )
            return None
        if adjustment.empty:
            return None
        return container_response(adjustment)

    async def on_disconnect(self) -> None:
        log.warning("disconnected from the runtime; pod events wait for the reconnect")


def _event(name: str, pod: nri_pb2.PodSandbox) -> PodInfo:
    """Every pod event is logged as it arrives, before any work: what the runtime asked for."""
    info = pod_info(pod)
    log.info("%s: pod %s id=%s netns=%s", name, info.label(), info.id, info.netns or "-")
    return info
