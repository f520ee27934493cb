"""The pod roster: one record per pod of what the daemon knows of it besides the CNI cache.

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

The roster's methods are named for the events that change a pod; its records are frozen and
replaced whole, and nothing outside this module reaches its table (tests/repo checks): others
read it through `Roster.view`, read-only and live.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from nri_cni.pod.model import PodInfo
from nri_cni.pod.upkeep import netns_gone, pause_alive

# seconds an attached pod the runtime does not list stays valid for GC: longer than a runtime
# takes from the CNI ADD's (or NRI RunPodSandbox's) return to storing the pod, which kubelet's
# runtime request timeout (2 min by default) bounds for a RunPodSandbox still in flight
UNLISTED_GRACE = 120.0


@dataclass(frozen=True)
class Unconfirmed:
    """A pod the runtime has not listed (yet, or any more): valid while the pod list it is
    counted from is the last or the one before, its netns exists and its grace lasts."""

    since: int  # the pod list count it is counted from
    netns: str
    at: float  # when its grace started


@dataclass(frozen=True)
class PodRecord:
    """One pod's truth, as far as the daemon knows it."""

    pod_id: str
    pod: PodInfo | None = None  # the runtime has it (its last list, or an event since)
    unconfirmed: Unconfirmed | None = None
    attached_at: float | None = None  # attached by this daemon and not listed since
    # the runtime tore it down (NRI stop, or its CNI DEL) and has not run or listed it since:
    # verify never attaches it again while its netns lingers
    stopped: bool = False
    attach_failed: bool = False  # its attach failed and verify retries it
    # native mode: its RunPodSandbox answer came past the runtime's deadline -> why (the
    # runtime made it without nri-cni; verify reports it "missed" with this)
    late: str = ""
    # its NRI StopPodSandbox came: the runtime sends it events (containerd sends none for pods
    # that lived through its restart), its RemovePodSandbox will come
    stop_event: bool = False
    # torn down and then listed again: a runtime restarted in the middle of its stop (CRI-O
    # after SIGTERM or SIGKILL) has it READY again
    relisted: bool = False
    # listed with IPs and later without: the runtime lost its own network of the pod, or its
    # record of it (CRI-O restarted in the middle of a stop)
    ips_lost: bool = False

    @property
    def empty(self) -> bool:
        return self == PodRecord(self.pod_id)

    @property
    def removal_overdue(self) -> bool:
        """Listed, torn down, and no NRI stop of it came: its RemovePodSandbox will not either."""
        return self.pod is not None and self.stopped and not self.stop_event


class Roster:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # the grace's (tests move it)
        self.synced = False  # a Synchronize arrived: GC may run
        self._records: dict[str, PodRecord] = {}
        # how many pod lists (Synchronizes) have come: an event's age, told at its arrival
        self.lists = 0

    # -- what a pod is -----------------------------------------------------------------------

    def record(self, pod_id: str) -> PodRecord:
        """The pod's record (an empty one for a pod nothing is known of)."""
        return self._records.get(pod_id) or PodRecord(pod_id)

    def pods(self) -> dict[str, PodInfo]:
        """The runtime's pods, as far as we know (a copy)."""
        return {r.pod_id: r.pod for r in self._records.values() if r.pod is not None}

    def view(self) -> Mapping[str, PodRecord]:
        """The records by pod id, read-only and live: a read is the roster's word when it is
        made (a pod nothing is known of has no record)."""
        return MappingProxyType(self._records)

    def running(self, pod_id: str) -> bool:
        """The runtime lists the pod, has not stopped it, and its pause process runs: the pod
        is there whatever became of its netns path (a path is not the runtime's word)."""
        rec = self.record(pod_id)
        return rec.pod is not None and not rec.stopped and pause_alive(rec.pod.pid)

    def listed_since(self, pod_id: str, lists: int) -> bool:
        """A pod list newer than `lists` has the pod: the runtime's newest word, which an older
        event of the pod (a stop or remove sent before a runtime restart that kept the pod,
        handled after the new runtime's list) must not undo."""
        return self.lists > lists and self.record(pod_id).pod is not None

    def pending_repair(self) -> frozenset[str]:
        """Pods whose attach failed and is retried."""
        return frozenset(r.pod_id for r in self._records.values() if r.attach_failed)

    # -- events ------------------------------------------------------------------------------

    def seen(self, pod: PodInfo) -> None:
        """The runtime told us about the pod (an NRI pod event). Not yet a confirmation: the
        runtime stores the pod only after the event, so a Synchronize may still miss it."""
        _put(self._records, pod.id, pod=pod, stopped=False, relisted=False)

    def attached(self, pod: PodInfo) -> None:
        """An ADD for the pod finished; the runtime lists the pod only later (and a
        Synchronize that comes first must not make it garbage)."""
        now = self.clock()
        unconfirmed = Unconfirmed(self.lists, pod.netns, now)
        _put(self._records, pod.id, unconfirmed=unconfirmed, attached_at=now, stopped=False, relisted=False)

    def answered(self, pod_id: str, ips: tuple[str, ...]) -> None:
        """Native mode: nri-cni answered RunPodSandbox with these IPs. The event's PodSandbox
        carried none (the runtime learns them from the answer); until a Synchronize says what
        the runtime really took, the answer is the best knowledge of its view."""
        pod = self.record(pod_id).pod
        if pod is not None and not pod.ips:
            _put(self._records, pod_id, pod=dataclasses.replace(pod, ips=ips))

    def stop_announced(self, pod_id: str) -> None:
        """The runtime's NRI StopPodSandbox of the pod came (its RemovePodSandbox will)."""
        _put(self._records, pod_id, stop_event=True)

    def stopped(self, pod_id: str) -> None:
        """The pod was torn down (NRI stop, the runtime's CNI DEL). Once the runtime's list
        came, a pod the roster has no record of is not the runtime's (containerd's DEL after
        its RemovePodSandbox): nothing is kept of it. Before that list, the teardown is kept:
        the list that has the pod makes it relisted (nri-cni restarted in a runtime's stop)."""
        if self.synced and pod_id not in self._records:
            return
        _put(self._records, pod_id, unconfirmed=None, attached_at=None, stopped=True)

    def removed(self, pod_id: str) -> None:
        """The pod is gone (NRI RemovePodSandbox, or reaped): nothing of it is kept."""
        self._records.pop(pod_id, None)

    def missed(self, pod_id: str, why: str) -> None:
        """Native mode: nri-cni's RunPodSandbox answer missed the runtime's deadline. The
        runtime holds the pod without nri-cni's IPs (it learns IPs only from that answer)."""
        pod = self.record(pod_id).pod
        changes: dict[str, object] = {"late": why, "unconfirmed": None, "relisted": False}
        if pod is not None:
            changes["pod"] = dataclasses.replace(pod, ips=())
        _put(self._records, pod_id, **changes)

    def attach_failed(self, pod_id: str) -> None:
        """The pod's attach failed (failure_policy keep): verify retries it."""
        _put(self._records, pod_id, attach_failed=True)

    def settled(self, pod_id: str) -> None:
        """Verify made the pod true, or reported it with nothing to retry: no attach retry."""
        _put(self._records, pod_id, attach_failed=False)

    def listed(self, pods: list[PodInfo]) -> None:
        """The runtime's full pod list (every (re)connection): the list is the roster, what is
        kept per pod goes with the pods it does not list."""
        new = {p.id: p for p in pods}
        self.lists += 1
        now = self.clock()
        for pod_id in set(self._records) | set(new):
            rec = self.record(pod_id)
            pod = new.get(pod_id)
            if pod is not None:
                before_ips = rec.pod is not None and bool(rec.pod.ips)
                _put(
                    self._records,
                    pod_id,
                    pod=pod,
                    ips_lost=not pod.ips and (rec.ips_lost or before_ips),
                    unconfirmed=None,
                    attached_at=None,
                    # torn down and listed again: the runtime's word is the newest
                    relisted=rec.relisted or rec.stopped,
                    stopped=False,
                )
                continue
            unconfirmed = rec.unconfirmed
            if unconfirmed is None and rec.pod is not None:
                # a pod the runtime had (listed, or an event) that this list misses gets until
                # the next one; a pod nri-cni never saw the runtime have (it was down) does not
                at = rec.attached_at if rec.attached_at is not None else now
                unconfirmed = Unconfirmed(self.lists - 1, rec.pod.netns, at)
            _put(
                self._records,
                pod_id,
                pod=None,
                unconfirmed=unconfirmed,
                stopped=False,
                stop_event=False,
                attach_failed=False,
                late="",
                relisted=False,
                ips_lost=False,
            )
        self.synced = True

    def collected(self, deleted: Iterable[str], attached: set[str], grace: float = UNLISTED_GRACE) -> None:
        """After a GC: forget the unconfirmed pods it deleted (names network/pod/ifname), and
        the ones no longer valid that have nothing left."""
        for name in deleted:
            _put(self._records, name.split("/")[1], unconfirmed=None, attached_at=None)
        still_valid = self.unconfirmed_valid(grace)
        for rec in list(self._records.values()):
            if rec.unconfirmed is not None and rec.pod_id not in still_valid | attached:
                _put(self._records, rec.pod_id, unconfirmed=None, attached_at=None)

    # -- GC's valid pods ---------------------------------------------------------------------

    def unconfirmed_valid(self, grace: float = UNLISTED_GRACE) -> set[str]:
        """Pods not listed by the runtime that are still given the benefit of the doubt: not
        yet listed since their attach, or missing from the last Synchronize only, while their
        netns exists and for `grace` seconds. (An entry goes when the pod is listed, stopped,
        removed or collected.)"""
        now = self.clock()
        return {
            r.pod_id
            for r in self._records.values()
            if (u := r.unconfirmed) is not None
            and self.lists - u.since <= 1
            and now - u.at < grace
            and not netns_gone(u.netns)
        }

    def valid_pod_ids(self, in_flight: Iterable[str], grace: float = UNLISTED_GRACE) -> set[str]:
        return set(self.pods()) | set(in_flight) | self.unconfirmed_valid(grace)


def _put(records: dict[str, PodRecord], pod_id: str, **changes: object) -> None:
    """The pod's record with `changes`; a record left with nothing in it goes."""
    rec = dataclasses.replace(records.get(pod_id) or PodRecord(pod_id), **changes)  # type: ignore[arg-type]
    if rec.empty:
        records.pop(pod_id, None)
    else:
        records[pod_id] = rec
