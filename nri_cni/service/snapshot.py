"""What the pod service offers the reports (`nri-cni status`, `pods`, `verify`): one snapshot,
taken at once, of what it knows. The reports read it and never the service's parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config
from nri_cni.pod.model import PodInfo
from nri_cni.service.podstate import PodHealth, PodState


@dataclass(frozen=True)
class Rounds:
    """The verify rounds finished since the daemon started."""

    count: int
    last: float | None  # wall time the last one finished
    last_seconds: float


@dataclass(frozen=True)
class ServiceSnapshot:
    cfg: Config
    mode: str
    listed: Mapping[str, PodInfo]  # the runtime's pods, as far as nri-cni knows
    pending_repair: frozenset[str]  # attaches retried (failure_policy keep)
    pending_rollback: tuple[str, ...]  # interrupted ADDs still to undo
    unconfirmed: int  # pods attached the runtime has not listed yet
    operations: int  # pods with an operation in flight
    background: int  # background tasks (GC, verify after a Synchronize)
    verdicts: tuple[PodHealth, ...]  # each pod's verdict from the last verify
    counts: Mapping[str, int]  # pods by verdict
    rounds: Rounds
    attachments: tuple[CacheEntry, ...]  # what nri-cni holds (its cache), read when asked for
    attachment_count: int  # how many entries its cache holds (file names only: cheap)
    runtime_attachments: tuple[CacheEntry, ...]  # the runtime's own (secondary mode's eth0)

    def broken(self) -> list[PodHealth]:
        return [h for h in self.verdicts if h.state is PodState.BROKEN]
