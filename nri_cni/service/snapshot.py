"""What the pod service offers the reports (`nri-cni status`, `pods`, `verify`): one snapshot,
taken at once, of what it knows (ServiceView). The reports read it and never the service's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config
from nri_cni.pod.model import PodInfo
from nri_cni.service.parts import ServiceParts
from nri_cni.service.podstate import PodHealth, PodState


@dataclass(frozen=True)
class Rounds:
    """The verify rounds finished since the daemon started."""

    count: int
    last: float | None  # wall time the last one finished
    last_seconds: float
    checked: int  # of them, the ones whose cadence CHECKs are done too
    checks_done: float | None  # wall time they were


@dataclass(frozen=True)
class ServiceSnapshot:
    cfg: Config
    mode: str
    listed: Mapping[str, PodInfo]  # the runtime's pods, as far as nri-cni knows
    pending_repair: frozenset[str]  # attaches retried (failure_policy keep)
    pending_rollback: tuple[str, ...]  # interrupted ADDs still to undo
    unconfirmed: int  # pods attached the runtime has not listed yet
    operations: int  # pods with an operation in flight
    background: int  # background tasks (GC, verify after a Synchronize, a round's CHECKs)
    verdicts: tuple[PodHealth, ...]  # each pod's verdict from the last verify
    counts: Mapping[str, int]  # pods by verdict
    rounds: Rounds
    attachments: tuple[CacheEntry, ...]  # what nri-cni holds (its cache), read when asked for
    attachment_count: int  # how many entries its cache holds (file names only: cheap)
    runtime_attachments: tuple[CacheEntry, ...]  # the runtime's own (secondary mode's eth0)

    def broken(self) -> list[PodHealth]:
        return [h for h in self.verdicts if h.state is PodState.BROKEN]


class ServiceView:
    """The pod service's side the reports read: one snapshot at a time, and a pod's attachments."""

    def __init__(self, parts: ServiceParts, *, background: Callable[[], int]) -> None:
        self.parts = parts
        self.background = background  # how many background tasks run (ServiceTimers.background)

    def snapshot(self, *, attachments: bool = True, runtime_attachments: bool = False) -> ServiceSnapshot:
        """What the reports show, taken at once. The caches are read only when asked for:
        `attachments` (nri-cni's own), `runtime_attachments` (the runtime's, secondary mode);
        the count of nri-cni's entries always (their names, no file opened)."""
        book, mode = self.parts.health, self.parts.mode
        held = tuple(self.attachments()) if attachments else ()
        return ServiceSnapshot(
            cfg=self.parts.cfg,
            mode=mode.name,
            listed=self.parts.roster.pods(),
            pending_repair=self.parts.roster.pending_repair(),
            pending_rollback=tuple(self.pending_rollbacks()),
            unconfirmed=sum(1 for r in self.parts.roster.view().values() if r.unconfirmed is not None),
            operations=len(self.parts.locks),
            background=self.background(),
            verdicts=tuple(book.all()),
            counts=book.counts(),
            rounds=Rounds(
                book.rounds,
                book.last_round,
                book.last_round_seconds,
                book.checked_rounds,
                book.checks_done_at,
            ),
            attachments=held,
            attachment_count=len(held) if attachments else self.parts.plan.cached_count(),
            runtime_attachments=tuple(mode.runtime_attachments()) if runtime_attachments else (),
        )

    def busy(self, pod_id: str) -> bool:
        return self.parts.locks.busy(pod_id)

    def attachments(self, pod_id: str | None = None) -> list[CacheEntry]:
        return self.parts.plan.cached(pod_id)

    def pending_rollbacks(self) -> list[str]:
        """Pods with an intent record and no operation in flight: a rollback waiting to be
        retried (or, for an instant, an ADD about to take its lock)."""
        return [p for p in self.parts.plan.intent_pod_ids() if not self.parts.locks.busy(p)]
