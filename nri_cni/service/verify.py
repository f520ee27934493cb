"""verify: the node is the truth. One round compares, for every pod the runtime lists
running with a netns, three things: the networks it should have (config + annotation), what
nri-cni recorded (its cache entries), and what the node shows (netlink through the node
inspector; the chain's CNI CHECK with the cached result on the policy's cadence, when forced, and
whenever netlink finds a difference). Then, per pod and under that pod's lock, the verdict goes
to the health book and, per `repair`, the repair runs (nri_cni/pod/repair.py).

What each difference leads to (a damaged attachment DELed and ADDed again with its IPs, a
missing network ADDed, an IP another pod holds never taken, failed repairs retried after
FIRST_RETRY with doubling, then broken): docs/reliability.md, per finding kind.

A pod with an operation in flight is left for the next round; the netlink read of a round is
done for all pods at once, outside any lock (it only reads); a pod whose records changed before
its lock was taken is read again under the lock. The cadence CHECKs of pods netlink found intact
run after the round, a few at once (checker.py); asked for by hand (`--check`, one pod) they
run in it. Repairs run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import Kind, NriCniError
from nri_cni.node import NodeInspector, VerifyPolicy
from nri_cni.pod.detach import attach_order
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import PodInfo
from nri_cni.pod.parallel import at_once
from nri_cni.pod.plan import PodPlan
from nri_cni.pod.repair import IpsNotRequestable, IpTaken, repair_selection
from nri_cni.pod.upkeep import GC_PLUGIN_NICE
from nri_cni.service.checker import Checker, CheckJob
from nri_cni.service.decide import ADMIN_ACTION, Policy, Reading, RepairOrder, Verdict, decide, judge_repair
from nri_cni.service.modes import Mode, RuntimeIps, mode_in_force
from nri_cni.service.podcheck import Key, PodCheck, Retry, ToRead, netns_unreadable, read_checks
from nri_cni.service.podstate import AttachmentVerdict, BrokenCode, HealthBook, PodHealth, PodState
from nri_cni.service.roster import PodRecord, Roster

log = logging.getLogger("nri_cni.daemon")


FIRST_RETRY = 1.0  # seconds before a failed repair is tried again; doubled after each failure
BACKOFF_CAP = 16  # the longest wait between tries, in verify intervals


def check_parallel() -> int:
    """CHECKs of intact pods a verify round runs at once: a CHECK is mostly its plugins' CPU
    (bridge, portmap's iptables), so a couple per CPU (one at a time, the 50 CHECKs of a round
    over 500 pods took 2.2 s)."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def signature(entries: Sequence[CacheEntry]) -> list[tuple[Key, object]]:
    """What a pod's round compares before and under its lock: its attachments and results."""
    return [(e.key, e.result) for e in entries]


def verdicts_of(c: PodCheck, failed_checks: dict[Key, str]) -> list[AttachmentVerdict]:
    """The verdict per attachment the health book keeps: unknown, netlink's finding, a failed
    CHECK, else ok; then the networks it lacks."""
    out = []
    for entry in c.entries:
        key = entry.key
        finding = c.findings.get(key)
        if key in c.unknown:
            out.append(AttachmentVerdict(key[0], key[1], *c.unknown[key]))
        elif finding is not None and not finding.ok:
            out.append(AttachmentVerdict(key[0], key[1], finding.kind.value, finding.reason))
        elif key in failed_checks:
            out.append(AttachmentVerdict(key[0], key[1], "check-failed", failed_checks[key]))
        else:
            out.append(AttachmentVerdict(key[0], key[1], "ok"))
    out += [AttachmentVerdict(*s.key, "missing", "not attached") for s in c.missing]
    return out


@dataclass(frozen=True)
class ModeRead:
    """A mode's reading of the runtime's IPs (`Mode.runtime_ips`) of one check and record."""

    check: PodCheck
    record: PodRecord
    mode: Mode  # the mode that read them (a round that starts meanwhile puts another in force)
    ips: RuntimeIps


class Verifier:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        *,
        plan: PodPlan,
        roster: Roster,
        locks: PodLocks,
        health: HealthBook,
        inspector: NodeInspector | None = None,
        pod_inspector: NodeInspector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`inspector`: the rounds' netns pool; `pod_inspector`: the pods' own (podcheck.py
        `node_shows`: never queued behind a round). Each made at its first use if not given."""
        self.plan = plan
        self.roster = roster
        # the roster's records, read-only and live (Roster.view): a round reads each pod's
        # record when it needs it, the roster's word at that moment, with no call per read
        self.records = roster.view()
        self.locks = locks
        self.health = health
        self.clock = clock  # the backoff's (tests move it)
        self._inspector = inspector
        self._pod_inspector = pod_inspector
        self._retries: dict[str, Retry] = {}
        self._round = asyncio.Lock()  # rounds never overlap (timer, Synchronize, on demand)
        self._repairing = asyncio.Lock()
        self.rounds = 0
        self.source = ConfigSource.of(cfg)
        # the mode of the round in progress, read once when it starts (rounds never overlap):
        # the pod service's one mode object of the config in force (modes.py)
        self.mode: Mode = mode_in_force(self.source)
        # the cadence CHECKs of a round's intact pods, after it: each under its pod's lock, its
        # plugins at GC's nice value (pod operations first); one that fails is repaired as a
        # round repairs
        self.checker = Checker(
            lambda job: self._settle(
                job.check, forced=False, explicit=False, nice=GC_PLUGIN_NICE, round_no=job.round_no
            ),
            parallel=check_parallel(),
            done=lambda: self.health.checks_done(time.time()),
        )

    @property
    def policy(self) -> VerifyPolicy:
        """Spreads CHECKs over rounds; a timer switched off still has rounds on demand."""
        return self.source.derived("verify_policy", VerifyPolicy.of)

    @property
    def inspector(self) -> NodeInspector:
        if self._inspector is None:  # its threads start on first use
            self._inspector = NodeInspector.with_workers()
        return self._inspector

    @property
    def pod_inspector(self) -> NodeInspector:
        if self._pod_inspector is None:
            self._pod_inspector = NodeInspector.with_workers()
        return self._pod_inspector

    def close(self) -> None:
        for inspector in (self._inspector, self._pod_inspector):
            if inspector is not None:
                inspector.close()

    def forget(self, pod_id: str) -> None:
        self._retries.pop(pod_id, None)

    def retain(self, pod_ids: set[str]) -> None:
        for gone in set(self._retries) - pod_ids:
            del self._retries[gone]

    # -- a round -----------------------------------------------------------------------------

    async def run(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        async with self._round:
            started = time.time()
            self.mode = mode_in_force(self.source)
            # made at the first round, pods or not: its one fd (the daemon's netns) is held from
            # then on, not from whenever the first pod came
            _ = self.inspector
            if pod_id is not None:
                pod = self._record(pod_id).pod
                if pod is None:
                    # closest existing kind: the argument names nothing (exit code "usage")
                    raise NriCniError(f"no pod {pod_id!r} in the runtime's pod list", kind=Kind.BAD_ENV)
                pods = [pod]
            else:
                pods = [
                    r.pod
                    for r in self.records.values()
                    if r.pod is not None and r.pod.netns and not self.locks.busy(r.pod_id) and not r.stopped
                ]
            self.rounds += 1
            by_pod: dict[str, list[CacheEntry]] = {}
            for entry in await asyncio.to_thread(self.plan.cached):
                by_pod.setdefault(entry.container_id, []).append(entry)
            to_read = [  # a pod whose netns path is gone: nothing to read (its pause may still run)
                self._plan(p, by_pod.get(p.id, []))
                if os.path.exists(p.netns)
                else ToRead(p, attach_order(by_pod.get(p.id, [])), [], path_gone=True)
                for p in pods
                if p.netns
            ]
            checks = await read_checks(self.inspector, to_read)
            out: list[PodHealth] = []
            explicit = pod_id is not None
            # pods netlink found intact whose only business is a CHECK: after the others
            first: list[PodCheck] = []
            later: list[PodCheck] = []
            for c in checks:
                (later if self._check_only(c, check) else first).append(c)
            for c in first:
                health = await self._settle(c, forced=check, explicit=explicit)
                if health is not None:
                    out.append(health)
            judged = [  # their verdict from netlink and the host side, until CHECKed
                self._unlocked(c, None, explicit=False) for c in later if not self.locks.busy(c.pod.id)
            ]
            by_hand = check or explicit  # the CHECKs' outcome is the answer: they run in the round
            if not by_hand:  # the timer's: they follow the round (checker.py)
                self.checker.queue([CheckJob(c, self.rounds) for c in later])
            if pod_id is None:  # every pod compared with the node: the round is done
                self.health.round_done(
                    started, time.time(), checked=not by_hand and not self.checker.pending()
                )
                self.retain(set(self.roster.pods()))
            if not by_hand:
                return out + [h for h in judged if h is not None]
            return out + await self._check_by_hand(later, check=check, explicit=explicit)

    async def _check_by_hand(self, later: list[PodCheck], *, check: bool, explicit: bool) -> list[PodHealth]:
        """The CHECKs of the pods netlink found intact (`later`) asked for by hand (forced, or
        one pod), run in the round as the checker runs them: their outcome is the answer."""
        done = await at_once(
            later,
            lambda c: self._settle(c, forced=check, explicit=explicit, nice=GC_PLUGIN_NICE),
            check_parallel(),
        )
        if not explicit and not self.checker.pending():  # none of an earlier round's still runs
            self.health.checks_done(time.time())
        return [h for h in done if h is not None]

    def _plan(self, pod: PodInfo, entries: list[CacheEntry]) -> ToRead:
        try:
            selected = self.plan.expected(pod, self.mode.primary)
        except NriCniError as exc:  # refused now (a reload): what it has is checked, nothing added
            log.debug("verify: pod %s: the config refuses it now (%s)", pod.label(), exc)
            selected = []
        return ToRead(pod, attach_order(entries), selected)

    def _check_only(self, c: PodCheck, forced: bool) -> bool:
        if c.netns_gone or c.damaged or c.missing:
            return False
        return not self.mode.runtime_ips(c, self._record(c.pod.id)).mismatch and bool(self._due(c, forced))

    # -- one pod -----------------------------------------------------------------------------

    def _record(self, pod_id: str) -> PodRecord:
        """The pod's record as the roster has it now (an empty one: nothing known of it)."""
        return self.records.get(pod_id) or PodRecord(pod_id)

    def _due(self, c: PodCheck, forced: bool, round_no: int | None = None) -> list[CacheEntry]:
        """The attachments round `round_no` (default: this one) CHECKs."""
        return [
            e
            for e in c.entries
            if e.result is not None
            and self.policy.needs_check(
                f"{c.pod.id}/{e.network_name}/{e.ifname}",
                self.rounds if round_no is None else round_no,
                differs=e.key in {d.key for d in c.damaged},
                forced=forced,
            )
        ]

    def _decide(
        self, c: PodCheck, read: ModeRead | None, *, explicit: bool, failed: Mapping[Key, str] | None = None
    ) -> Verdict | RepairOrder:
        """What the round read of the pod leads to (decide.py): its reading, its record, the
        mode's reading of the runtime's IPs (`read` when made of this check and record by the mode
        in force, else asked again), the repair policy with the pod's failed tries."""
        # whether its pause process runs: probed only for a pod whose netns is gone, the one
        # case decide asks it of
        reading = Reading(c, failed or {}, c.netns_gone and self.roster.running(c.pod.id))
        record = self._record(c.pod.id)
        if read is None or read.check is not c or read.record != record or read.mode is not self.mode:
            ips = self.mode.runtime_ips(c, record)
        else:
            ips = read.ips
        policy = Policy(self.source.current.repair, self._retries.get(c.pod.id), self.clock(), explicit)
        return decide(reading, record, ips, policy)

    def _unlocked(self, c: PodCheck, read: ModeRead | None, *, explicit: bool) -> PodHealth | None:
        """The verdict of a pod with nothing to run (nothing differs, no CHECK due, or nothing
        nri-cni can change): no lock needed, nothing awaited."""
        decision = self._decide(c, read, explicit=explicit)
        assert isinstance(decision, Verdict)  # a repair is ordered only when something differs
        return self._report(c, decision, verdicts_of(c, {}))

    async def _settle(
        self, c: PodCheck, *, forced: bool, explicit: bool, nice: int = 0, round_no: int | None = None
    ) -> PodHealth | None:
        """The pod's part of round `round_no` (default: this one): without its lock when there
        is nothing to run, else under it, its records read again when an operation ran since the
        round read them (a pod stopped, removed or collected meanwhile is not CHECKed)."""
        pod = c.pod
        record = self._record(pod.id)
        read = ModeRead(c, record, self.mode, self.mode.runtime_ips(c, record))
        ips = read.ips
        quiet = not c.damaged and not c.missing and not ips.mismatch and not self._due(c, forced, round_no)
        if c.netns_gone or ips.lost or (quiet and not self.locks.busy(pod.id)):
            return self._unlocked(c, read, explicit=explicit)
        if not explicit and self.locks.busy(pod.id):
            return None  # an operation in flight: the next round
        async with self.locks.pod(pod.id):
            record = self._record(pod.id)
            if record.pod is None or not os.path.exists(record.pod.netns):
                return None
            if record.stopped:  # torn down while the round read it: read no further
                return self._unlocked(c, read, explicit=explicit)
            pod = record.pod
            now = self.plan.cached(pod.id)
            if signature(attach_order(now)) != signature(c.entries):
                (c,) = await read_checks(self.inspector, [self._plan(pod, now)])  # an operation ran since
            failed: dict[Key, str] = {}  # the CHECKs due this round that failed -> the error
            niced = PLUGIN_NICE.set(nice)  # this task's CHECK plugins only
            try:
                for entry in self._due(c, forced, round_no) if not c.netns_gone else []:
                    error = await self.plan.check_entry(entry, c.pod.netns)
                    if error:
                        failed[entry.key] = error
            finally:
                PLUGIN_NICE.reset(niced)
            return await self._apply_locked(
                c, self._decide(c, read, explicit=explicit, failed=failed), failed
            )

    async def _apply_locked(
        self, c: PodCheck, decision: Verdict | RepairOrder, failed: Mapping[Key, str]
    ) -> PodHealth | None:
        if isinstance(decision, Verdict):
            return self._report(c, decision, verdicts_of(c, dict(failed)))
        retry = self._retries.setdefault(c.pod.id, Retry())
        retry.ips = dict(decision.ips)
        verdicts = verdicts_of(c, dict(failed))
        try:
            async with self._repairing:  # one at a time, also when pods settle at once
                await self.plan.repair(
                    c.pod,
                    selected=repair_selection(c.selected, c.entries, [e.key for e in decision.damaged]),
                    damaged=list(decision.damaged),
                    ips=retry.ips,
                    wrong=list(decision.wrong),
                    runtime_primary=self.mode.runtime_primary,
                )
        except IpTaken as exc:
            self._failed(retry)
            reason = f"{decision.what}; {exc}: never taken from it; {ADMIN_ACTION}"
            return self._report(c, Verdict(PodState.BROKEN, BrokenCode.IP_TAKEN, reason), verdicts)
        except IpsNotRequestable as exc:  # nothing was touched, nothing to retry
            reason = f"{decision.what}; {exc}; {ADMIN_ACTION}"
            verdict = Verdict(PodState.BROKEN, BrokenCode.IPS_NOT_REQUESTABLE, reason, settles=True)
            return self._report(c, verdict, verdicts)
        except NriCniError as exc:
            return self._judged(c, decision, retry, verdicts, error=str(exc))
        (after,) = await read_checks(
            self.inspector, [self._plan(c.pod, self.plan.cached(c.pod.id))]
        )  # read again
        return self._judged(c, decision, retry, verdicts, after=after)

    def _judged(
        self,
        c: PodCheck,
        order: RepairOrder,
        retry: Retry,
        verdicts: list[AttachmentVerdict],
        *,
        after: PodCheck | None = None,
        error: str = "",
    ) -> PodHealth | None:
        if error or after is None or after.damaged or after.missing:
            self._failed(retry)
        verdict = judge_repair(after or c, order, retry.failures, error)
        if verdict.state is PodState.REPAIRED:
            log.info("pod %s id=%s repaired: %s", c.pod.label(), c.pod.id, verdict.reason)
            return self._report(c, verdict, verdicts_of(after or c, {}))
        if verdict.state is None:
            log.warning(
                "pod %s id=%s: %s (again in %.0f s)",
                c.pod.label(),
                c.pod.id,
                verdict.why,
                retry.next_at - self.clock(),
            )
        return self._report(c, verdict, verdicts)

    def _report(self, c: PodCheck, verdict: Verdict, verdicts: list[AttachmentVerdict]) -> PodHealth | None:
        """The verdict into the health book (None: nothing reported this round; the pod's last
        verdict, if any, stands)."""
        pod = c.pod
        if verdict.ends_retries:
            self._retries.pop(pod.id, None)
        if verdict.settles:
            self.roster.settled(pod.id)
        if verdict.state is None:
            return self.health.get(pod.id) if verdict.stands else None
        if verdict.state is PodState.OK:
            return self.health.ok(pod.id, verdicts, label=pod.label())
        if verdict.state is PodState.REPAIRED:
            return self.health.repaired(pod.id, verdict.reason, verdicts)
        assert verdict.code is not None
        if verdict.code is BrokenCode.NETNS_UNREADABLE:
            verdicts = netns_unreadable(pod, attach_order(c.entries))[1]
        return self.health.broken(
            pod.id, verdict.code, verdict.reason, verdicts, label=f"{pod.namespace}/{pod.name}"
        )

    def _failed(self, retry: Retry) -> None:
        retry.failed(self.clock(), FIRST_RETRY, (self.source.current.verify_interval or 30.0) * BACKOFF_CAP)
