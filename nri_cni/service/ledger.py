"""The pod ledger: what the daemon knows of the runtime's pods besides the CNI cache.

Which pods are valid for GC (docs/reliability.md, section 2): the runtime's pod list (the last
Synchronize plus the pod events since), the pods with an operation in flight, and, while their
netns exists and for at most `grace` seconds (UNLISTED_GRACE, `gc.unlisted_grace`), the pods
the runtime has not listed yet or for the first time: attached since the previous Synchronize
(a runtime stores a new pod only after its CNI ADD or NRI RunPodSandbox returned, so a
Synchronize in between does not list it; the grace counts from the attach), or had by the
runtime before and missing from the last Synchronize only (containerd leaves a pod whose state
it cannot tell yet out of its NRI list; the grace counts from its attach by this daemon, or
from the Synchronize that missed it for a pod listed before). Past the grace, missing from two
Synchronizes in a row, its netns gone, or removed by a pod event: garbage, although its netns
may still exist (CRI-O drops a pod whose creation its restart cut and leaves the netns pinned).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from nri_cni.pod.model import PodInfo
from nri_cni.pod.upkeep import netns_gone, pause_alive

# seconds an attached pod the runtime does not list stays valid for GC: longer than a runtime
# takes from the CNI ADD's (or NRI RunPodSandbox's) return to storing the pod, which kubelet's
# runtime request timeout (2 min by default) bounds for a RunPodSandbox still in flight
UNLISTED_GRACE = 120.0


class PodLedger:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # the grace's (tests move it)
        self.pods: dict[str, PodInfo] = {}  # the runtime's pods, as far as we know
        self.synced = False  # a Synchronize arrived: GC may run
        self.repair: dict[str, PodInfo] = {}  # pods whose attach failed and is retried
        # pods the runtime has not listed (yet, or any more) -> (the Synchronize count they
        # are counted from, their netns, when their grace started): valid while that count is
        # the last or the one before and the grace lasts
        self.unconfirmed: dict[str, tuple[int, str, float]] = {}
        # pods attached by this daemon and not listed since -> when (their grace's start)
        self.attached_at: dict[str, float] = {}
        # pods the runtime tore down (NRI stop, or its CNI DEL) and has not run or listed
        # since: verify never attaches them again while their netns lingers
        self.stopped: set[str] = set()
        # native mode: pods whose RunPodSandbox answer came past the runtime's deadline -> why
        # (the runtime made them without nri-cni; verify reports them "missed" with this)
        self.late: dict[str, str] = {}
        # pods whose NRI StopPodSandbox came: the runtime sends them events (containerd sends
        # none for pods that lived through its restart), their RemovePodSandbox will come
        self.stop_events: set[str] = set()
        # pods the runtime tore down and then listed again in a Synchronize: a runtime restarted
        # in the middle of its stop (CRI-O after SIGTERM or SIGKILL) has them READY again
        self.relisted: set[str] = set()
        # pods a Synchronize listed with IPs and a later one without: the runtime lost its own
        # network of the pod, or its record of it (CRI-O restarted in the middle of a stop)
        self.ips_lost: set[str] = set()
        self._syncs = 0

    def seen(self, pod: PodInfo) -> None:
        """The runtime told us about the pod (an NRI pod event). Not yet a confirmation: the
        runtime stores the pod only after the event, so a Synchronize may still miss it."""
        self.pods[pod.id] = pod
        self.stopped.discard(pod.id)
        self.relisted.discard(pod.id)

    def attached(self, pod: PodInfo) -> None:
        """An ADD for the pod finished; the runtime lists the pod only later (and a
        Synchronize that comes first must not make it garbage)."""
        now = self.clock()
        self.unconfirmed[pod.id] = (self._syncs, pod.netns, now)
        self.attached_at[pod.id] = now
        self.stopped.discard(pod.id)
        self.relisted.discard(pod.id)

    def answered(self, pod_id: str, ips: tuple[str, ...]) -> None:
        """Native mode: nri-cni answered RunPodSandbox with these IPs. The event's PodSandbox
        carried none (the runtime learns them from the answer); until a Synchronize says what
        the runtime really took, the answer is the best knowledge of its view."""
        pod = self.pods.get(pod_id)
        if pod is not None and not pod.ips:
            self.pods[pod_id] = dataclasses.replace(pod, ips=ips)

    def detached(self, pod_id: str) -> None:
        self.unconfirmed.pop(pod_id, None)
        self.attached_at.pop(pod_id, None)
        self.stopped.add(pod_id)

    def gone(self, pod_id: str) -> None:
        self.pods.pop(pod_id, None)
        self.attached_at.pop(pod_id, None)
        self.repair.pop(pod_id, None)
        self.unconfirmed.pop(pod_id, None)
        self.stopped.discard(pod_id)
        self.late.pop(pod_id, None)
        self.stop_events.discard(pod_id)
        self.ips_lost.discard(pod_id)

    def running(self, pod_id: str) -> bool:
        """The runtime lists the pod, has not stopped it, and its pause process runs: the pod
        is there whatever became of its netns path (a path is not the runtime's word)."""
        pod = self.pods.get(pod_id)
        return pod is not None and pod_id not in self.stopped and pause_alive(pod.pid)

    def missed(self, pod_id: str, why: str) -> None:
        """Native mode: nri-cni's RunPodSandbox answer missed the runtime's deadline. The
        runtime holds the pod without nri-cni's IPs (it learns IPs only from that answer)."""
        self.late[pod_id] = why
        self.unconfirmed.pop(pod_id, None)
        pod = self.pods.get(pod_id)
        if pod is not None:
            self.pods[pod_id] = dataclasses.replace(pod, ips=())
        self.relisted.discard(pod_id)

    @property
    def lists(self) -> int:
        """How many pod lists (Synchronizes) have come: an event's age, told at its arrival."""
        return self._syncs

    def listed_since(self, pod_id: str, lists: int) -> bool:
        """A pod list newer than `lists` has the pod: the runtime's newest word, which an older
        event of the pod (a stop or remove sent before a runtime restart that kept the pod,
        handled after the new runtime's list) must not undo."""
        return self._syncs > lists and pod_id in self.pods

    def needs_repair(self, pod: PodInfo) -> None:
        self.repair[pod.id] = pod

    def synchronized(self, pods: list[PodInfo]) -> None:
        """The runtime's full pod list (every (re)connection)."""
        previous, self.pods = self.pods, {p.id: p for p in pods}
        for pod in pods:
            before = previous.get(pod.id)
            if pod.ips:
                self.ips_lost.discard(pod.id)
            elif before is not None and before.ips:
                self.ips_lost.add(pod.id)
        self.ips_lost &= set(self.pods)
        self._syncs += 1
        now = self.clock()
        for pod_id in self.pods:
            self.unconfirmed.pop(pod_id, None)
            self.attached_at.pop(pod_id, None)
            if pod_id in self.stopped:  # listed again: the runtime's word is the newest
                self.stopped.discard(pod_id)
                self.relisted.add(pod_id)
        self.relisted &= set(self.pods)
        # a pod the runtime had (listed, or an event) that this list misses gets until the next
        # one; a pod nri-cni never saw the runtime have (it was down) does not
        for pod_id, pod in previous.items():
            if pod_id not in self.pods and pod_id not in self.unconfirmed:
                self.unconfirmed[pod_id] = (self._syncs - 1, pod.netns, self.attached_at.get(pod_id, now))
        # the list is the roster: what is kept per pod goes with the pods it does not list
        # (a pod stopped and listed again was dropped from `stopped` above)
        self.stopped.clear()
        self.stop_events &= set(self.pods)
        for table in (self.repair, self.late):
            for pod_id in [p for p in table if p not in self.pods]:
                del table[pod_id]
        self.synced = True

    def unconfirmed_valid(self, grace: float = UNLISTED_GRACE) -> set[str]:
        """Pods not listed by the runtime that are still given the benefit of the doubt: not
        yet listed since their attach, or missing from the last Synchronize only, while their
        netns exists and for `grace` seconds. (An entry goes when the pod is listed, detached,
        gone or collected.)"""
        now = self.clock()
        return {
            pod_id
            for pod_id, (since, netns, at) in self.unconfirmed.items()
            if self._syncs - since <= 1 and now - at < grace and not netns_gone(netns)
        }

    def valid_pod_ids(self, in_flight: Iterable[str], grace: float = UNLISTED_GRACE) -> set[str]:
        return set(self.pods) | set(in_flight) | self.unconfirmed_valid(grace)

    def collected(self, deleted: Iterable[str], attached: set[str], grace: float = UNLISTED_GRACE) -> None:
        """After a GC: forget the unconfirmed pods it deleted (names network/pod/ifname), and
        the ones no longer valid that have nothing left."""
        for name in deleted:
            pod_id = name.split("/")[1]
            self.unconfirmed.pop(pod_id, None)
            self.attached_at.pop(pod_id, None)
        still_valid = self.unconfirmed_valid(grace)
        if len(still_valid) < len(self.unconfirmed):
            for pod_id in list(self.unconfirmed):
                if pod_id not in still_valid and pod_id not in attached:
                    del self.unconfirmed[pod_id]
                    self.attached_at.pop(pod_id, None)
