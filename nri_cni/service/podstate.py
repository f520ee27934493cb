"""Each pod's verdict from the last verify: ok, repaired or broken (docs/reliability.md).

The node inspector says what differs; the pod service decides what that means for the pod and
records it here; `nri-cni status`, `nri-cni pods`, `nri-cni verify` and the metrics read it. A
pod the daemon has never verified has no entry (it is not reported as anything yet).

broken: nri-cni cannot make the pod's networks true again by itself, and an admin must act.
The reason says why, in words an admin can act on; `code` is the stable token scripts and
metrics use.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

log = logging.getLogger("nri_cni.daemon")

DEL_ACTION = (
    "find why in the plugin's error (a plugin binary missing or failing); once fixed, GC or the "
    "runtime's next stop releases it"
)


class PodState(Enum):
    OK = "ok"  # what the records say is what the node has
    REPAIRED = "repaired"  # it differed, and a repair made it true again (with the same IPs)
    BROKEN = "broken"  # it differs and nri-cni will not (or cannot) repair it


class BrokenCode(Enum):
    """Why a pod is broken: the only reasons docs/reliability.md lists."""

    IP_TAKEN = "ip-taken"  # the IP the runtime reports for it now belongs to another pod
    REPAIR_FAILED = "repair-failed"  # repairs kept failing; backed off
    MISSED = "missed"  # native mode: the runtime created it without nri-cni's answer
    REPAIR_OFF = "repair-off"  # it differs and `repair` is off or verify-only
    # its IPs must come back and its chain cannot be asked for addresses (no `ips` capability,
    # no IPAM reading args.cni.ips): not cut
    IPS_NOT_REQUESTABLE = "ips-not-requestable"
    DEL_FAILED = "del-failed"  # its DEL (stop, remove, GC) fails: resources held, the reason says why
    NETNS_UNREADABLE = "netns-unreadable"  # its netns path is gone while the pod still runs
    UNREADABLE = "unreadable"  # part of what it needs could not be read: never called ok
    TORN_DOWN = "torn-down"  # the runtime deleted its network (shim: through the shim), then listed it READY


@dataclass(frozen=True)
class AttachmentVerdict:
    """One attachment as the last verify saw it."""

    network: str
    ifname: str
    finding: str  # a FindingKind value ("ok", "link-missing", ...) or "check-failed"
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "interface": self.ifname,
            "finding": self.finding,
            "detail": self.detail,
        }


@dataclass
class PodHealth:
    pod_id: str
    state: PodState
    reason: str = ""  # for people; empty when ok
    code: BrokenCode | None = None  # set when broken
    since: float = field(default_factory=time.time)  # when the pod entered this state
    repairs: int = 0  # repairs done since nri-cni started
    attachments: list[AttachmentVerdict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod_id,
            "state": self.state.value,
            "reason": self.reason,
            "code": self.code.value if self.code else "",
            "since": round(self.since, 3),
            "repairs": self.repairs,
            "attachments": [a.to_dict() for a in self.attachments],
        }


class HealthBook:
    """pod id -> PodHealth. Written by the pod service only; read by the reports."""

    def __init__(self) -> None:
        self._pods: dict[str, PodHealth] = {}
        self.rounds = 0  # verify rounds finished since start
        self.last_round: float | None = None  # wall time the last round finished (None: none yet)
        self.last_round_seconds = 0.0  # how long it took
        self.checked_rounds = 0  # of those, the rounds whose cadence CHECKs are done too
        self.checks_done_at: float | None = None  # wall time they were (None: not yet)

    def round_done(self, started: float, finished: float, *, checked: bool = False) -> None:
        """A verify round over every pod finished (the first one after start-up makes the
        daemon "verified": docs/reliability.md); `checked`: no cadence CHECK of it, or of an
        earlier round, is left to run."""
        self.rounds += 1
        self.last_round = finished
        self.last_round_seconds = finished - started
        if checked:
            self.checks_done(finished)

    def checks_done(self, finished: float) -> None:
        """The cadence CHECKs of every round finished so far are done (they follow the round)."""
        self.checked_rounds = self.rounds
        self.checks_done_at = finished

    def get(self, pod_id: str) -> PodHealth | None:
        return self._pods.get(pod_id)

    def ok(
        self, pod_id: str, attachments: list[AttachmentVerdict] | None = None, *, label: str = ""
    ) -> PodHealth:
        """Verified and true. A pod that was repaired stays "repaired" (with its count) until
        it is forgotten: an admin wants to see that it happened. One log line as a pod leaves
        broken (`label`: the pod's name for it)."""
        old = self._pods.get(pod_id)
        if old is not None and old.state is PodState.BROKEN:
            code = old.code.value if old.code else ""
            log.info("pod %s id=%s is no longer broken (%s): the node agrees again", label, pod_id, code)
        if old is not None and old.state is PodState.REPAIRED:
            old.attachments = attachments or []
            return old
        health = PodHealth(pod_id, PodState.OK, attachments=attachments or [])
        if old is not None and old.state is PodState.OK:
            health.since = old.since
        self._pods[pod_id] = health
        return health

    def repaired(
        self, pod_id: str, reason: str, attachments: list[AttachmentVerdict] | None = None
    ) -> PodHealth:
        old = self._pods.get(pod_id)
        health = PodHealth(
            pod_id,
            PodState.REPAIRED,
            reason=reason,
            repairs=(old.repairs if old else 0) + 1,
            attachments=attachments or [],
        )
        self._pods[pod_id] = health
        return health

    def broken(
        self,
        pod_id: str,
        code: BrokenCode,
        reason: str,
        attachments: list[AttachmentVerdict] | None = None,
        *,
        label: str = "",
    ) -> PodHealth:
        """Returns the entry; `since` is kept while the pod stays broken for the same code. One
        log line as a pod enters (this) broken state (`label`: the pod's name for it)."""
        old = self._pods.get(pod_id)
        if old is None or old.code is not code:
            log.warning("pod %s id=%s is broken (%s): %s", label, pod_id, code.value, reason)
        health = PodHealth(
            pod_id,
            PodState.BROKEN,
            reason=reason,
            code=code,
            repairs=old.repairs if old else 0,
            attachments=attachments or [],
        )
        if old is not None and old.state is PodState.BROKEN and old.code is code:
            health.since = old.since
        self._pods[pod_id] = health
        return health

    def del_failed(self, pod_id: str, error: str, *, label: str = "") -> PodHealth:
        """A DEL that fails is named, with its reason, in `nri-cni status` and `nri-cni pods`
        (once in the log as it starts failing); GC retries it while the runtime does not list
        the pod, the runtime's stop retries it while it does."""
        reason = f"its DEL fails, so nri-cni still holds its networks: {error}; {DEL_ACTION}"
        return self.broken(pod_id, BrokenCode.DEL_FAILED, reason, label=label)

    def fails_del(self, pod_id: str) -> bool:
        """The pod's last DEL failed (broken del-failed)."""
        health = self._pods.get(pod_id)
        return health is not None and health.code is BrokenCode.DEL_FAILED

    def forget(self, pod_id: str) -> None:
        """The pod is gone (removed, or collected)."""
        self._pods.pop(pod_id, None)

    def retain(self, pod_ids: set[str]) -> None:
        """Only these pods are (the runtime's list): every other verdict goes."""
        for pod_id in [p for p in self._pods if p not in pod_ids]:
            del self._pods[pod_id]

    def broken_pods(self) -> list[PodHealth]:
        return [h for h in self._pods.values() if h.state is PodState.BROKEN]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in PodState}
        for h in self._pods.values():
            out[h.state.value] += 1
        return out

    def all(self) -> list[PodHealth]:
        return list(self._pods.values())

    def __len__(self) -> int:
        return len(self._pods)
