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
its lock was taken is read again under the lock. The CHECKs of pods netlink found intact run
a few at once (podcheck.check_parallel); repairs run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.config import Config, ConfigSource
from nri_cni.errors import Kind, NriCniError
from nri_cni.node import NodeInspector, VerifyPolicy
from nri_cni.pod.detach import attach_order
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import PodInfo
from nri_cni.pod.plan import PodPlan
from nri_cni.pod.repair import IpsNotRequestable, IpTaken, repair_selection, result_ips
from nri_cni.pod.upkeep import GC_PLUGIN_NICE
from nri_cni.service.modes import Mode
from nri_cni.service.podcheck import (
    Key,
    PodCheck,
    Retry,
    at_once,
    build_check,
    check_parallel,
    expect,
    key_of,
    netns_unreadable,
    selected_key,
    unreadable_reason,
    verdicts_of,
)
from nri_cni.service.podstate import AttachmentVerdict, BrokenCode, HealthBook, PodHealth
from nri_cni.service.roster import Roster
from nri_cni.service.runtime_ips import (
    ip_mismatch,
    missed_reason,
    native_readd,
    primary_key,
    runtime_network_lost,
)

log = logging.getLogger("nri_cni.daemon")


MAX_FAILURES = 3  # failed repairs in a row before the pod is reported broken
FIRST_RETRY = 1.0  # seconds before a failed repair is tried again; doubled after each failure
BACKOFF_CAP = 16  # the longest wait between tries, in verify intervals
ADMIN_ACTION = "delete the pod (kubectl delete pod); kubelet creates it again with its networks"


class Verifier:
    def __init__(
        self,
        cfg: Config | ConfigSource,
        mode: Callable[[], Mode],
        *,
        plan: PodPlan,
        roster: Roster,
        locks: PodLocks,
        health: HealthBook,
        inspector: NodeInspector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.roster = roster
        self.locks = locks
        self.health = health
        self.clock = clock  # the backoff's (tests move it)
        self._inspector = inspector
        self._retries: dict[str, Retry] = {}
        self._round = asyncio.Lock()  # rounds never overlap (timer, Synchronize, on demand)
        self._repairing = asyncio.Lock()
        self.rounds = 0
        self.source = ConfigSource.of(cfg)
        self._mode = mode  # the pod service's: one mode object for every part

    @property
    def cfg(self) -> Config:
        return self.source.current

    @property
    def mode(self) -> Mode:
        return self._mode()

    @property
    def policy(self) -> VerifyPolicy:
        """Spreads CHECKs over rounds; a timer switched off still has rounds on demand."""
        return self.source.derived("verify_policy", VerifyPolicy.of)

    @property
    def inspector(self) -> NodeInspector:
        if self._inspector is None:  # its threads start on first use
            self._inspector = NodeInspector()
        return self._inspector

    def close(self) -> None:
        if self._inspector is not None:
            self._inspector.close()

    def forget(self, pod_id: str) -> None:
        self._retries.pop(pod_id, None)

    def retain(self, pod_ids: set[str]) -> None:
        for gone in set(self._retries) - pod_ids:
            del self._retries[gone]

    # -- a round -----------------------------------------------------------------------------

    async def run(self, pod_id: str | None = None, *, check: bool = False) -> list[PodHealth]:
        async with self._round:
            started = time.time()
            # made at the first round, pods or not: its one fd (the daemon's netns) is held from
            # then on, not from whenever the first pod came
            _ = self.inspector
            if pod_id is not None:
                pod = self.roster.record(pod_id).pod
                if pod is None:
                    # closest existing kind: the argument names nothing (exit code "usage")
                    raise NriCniError(f"no pod {pod_id!r} in the runtime's pod list", kind=Kind.BAD_ENV)
                pods = [pod]
            else:
                pods = [
                    r.pod
                    for r in self.roster
                    if r.pod is not None and r.pod.netns and not self.locks.busy(r.pod_id) and not r.stopped
                ]
            self.rounds += 1
            by_pod: dict[str, list[CacheEntry]] = {}
            for entry in await asyncio.to_thread(self.plan.cached):
                by_pod.setdefault(entry.container_id, []).append(entry)
            live, lost = [], []
            for p in pods:
                if p.netns and os.path.exists(p.netns):
                    live.append(p)
                elif p.netns and self.roster.running(p.id):
                    lost.append(p)
            checks = [self._plan(p, by_pod.get(p.id, [])) for p in live]
            await self._inspect(checks)
            out = [self._netns_unreadable(p, by_pod.get(p.id, [])) for p in lost]
            explicit = pod_id is not None
            # pods netlink found intact whose only business is a CHECK: several at once, last
            first: list[PodCheck] = []
            later: list[PodCheck] = []
            for c in checks:
                (later if self._check_only(c, check) else first).append(c)
            for c in first:
                health = await self._settle(c, forced=check, explicit=explicit)
                if health is not None:
                    out.append(health)
            for c in later:  # their verdict from netlink and the host side, until CHECKed
                if not self.locks.busy(c.pod.id):
                    self._intact(c)
            if pod_id is None:  # every pod compared with the node: the round is done ...
                self.health.round_done(started, time.time())
                self.retain(set(self.roster.pods()))
            # ... and its CHECKs of intact pods follow, check_parallel() at once, each under its
            # pod's lock, their plugins at GC's nice value (pod operations first); a CHECK that
            # fails leads to the repair as above
            done = await at_once(
                later,
                lambda c: self._settle(c, forced=check, explicit=explicit, nice=GC_PLUGIN_NICE),
                check_parallel(),
            )
            return out + [h for h in done if h is not None]

    def _plan(self, pod: PodInfo, entries: list[CacheEntry]) -> PodCheck:
        try:
            selected = self.plan.expected(pod, self.mode.primary)
        except NriCniError as exc:  # refused now (a reload): what it has is checked, nothing added
            log.debug("verify: pod %s: the config refuses it now (%s)", pod.label(), exc)
            selected = []
        return build_check(pod, attach_order(entries), selected)

    async def node_shows(self, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
        """Whether netlink shows each of `entries` as its result says (the pod's links up with
        their addresses and routes, their host-side links): nothing unreadable, nothing
        differs. The host's rules and leases are not read (no iptables-save): a cheap look."""
        c = PodCheck(pod, list(entries), [])
        expect(c, host_side=False)
        if c.unknown or len(c.expectations) != len(entries):
            return False
        await self._inspect([c])
        return len(c.findings) == len(entries) and all(f.ok for f in c.findings.values())

    async def _inspect(self, checks: Sequence[PodCheck]) -> None:
        exps = [e for c in checks for _, e in c.expectations]
        if not exps:
            return
        findings = iter(await self.inspector.inspect(exps))
        for c in checks:
            c.findings = {key_of(entry): next(findings) for entry, _ in c.expectations}

    def _check_only(self, c: PodCheck, forced: bool) -> bool:
        return not (c.netns_gone or c.damaged or c.missing or ip_mismatch(self.mode, c)) and bool(
            self._due(c, forced)
        )

    # -- one pod -----------------------------------------------------------------------------

    def _intact(self, c: PodCheck) -> PodHealth | None:
        """The verdict of a pod netlink found as recorded (unreadable parts are not ok)."""
        if self.roster.record(c.pod.id).pod is None:
            return None
        self._retries.pop(c.pod.id, None)
        if c.unreadable:
            return self._unreadable(c.pod, c, verdicts_of(c, {}))
        return self._ok(c.pod, verdicts_of(c, {}))

    def _due(self, c: PodCheck, forced: bool) -> list[CacheEntry]:
        """The attachments this round CHECKs."""
        return [
            e
            for e in c.entries
            if e.result is not None
            and self.policy.needs_check(
                f"{c.pod.id}/{e.network_name}/{e.ifname}",
                self.rounds,
                differs=key_of(e) in {key_of(d) for d in c.damaged},
                forced=forced,
            )
        ]

    async def _settle(self, c: PodCheck, *, forced: bool, explicit: bool, nice: int = 0) -> PodHealth | None:
        pod = c.pod
        if c.netns_gone:
            if self.roster.running(pod.id):
                return self._netns_unreadable(pod, c.entries)
            return None  # the reaper's
        lost = runtime_network_lost(self.mode, self.roster.record(pod.id), c)
        if lost:  # not nri-cni's network: nothing to repair; its own are kept while it is listed
            self._retries.pop(pod.id, None)
            return self._broken(pod, BrokenCode.TORN_DOWN, f"{lost}; {ADMIN_ACTION}", verdicts_of(c, {}))
        quiet = not c.damaged and not c.missing and not ip_mismatch(self.mode, c) and not self._due(c, forced)
        if quiet and not self.locks.busy(pod.id):
            return self._intact(c)  # nothing to run: no lock needed, nothing awaited
        if not explicit and self.locks.busy(pod.id):
            return None  # an operation in flight: the next round
        async with self.locks.pod(pod.id):
            record = self.roster.record(pod.id)
            if record.pod is None or not os.path.exists(record.pod.netns):
                return None
            pod = record.pod
            if record.stopped:
                return None  # torn down (while the round read it): never attached again
            now = self.plan.cached(pod.id)
            if [(key_of(e), e.result) for e in attach_order(now)] != c.signature():
                c = self._plan(pod, now)  # an operation ran since the round read it
                await self._inspect([c])
                if c.netns_gone:
                    return self._netns_unreadable(pod, c.entries) if self.roster.running(pod.id) else None
            return await self._settle_locked(c, forced=forced, explicit=explicit, nice=nice)

    async def _settle_locked(
        self, c: PodCheck, *, forced: bool, explicit: bool, nice: int = 0
    ) -> PodHealth | None:
        pod = c.pod
        failed_checks: dict[Key, str] = {}
        niced = PLUGIN_NICE.set(nice)  # this task's CHECK plugins only
        try:
            for entry in self._due(c, forced):
                error = await self.plan.check_entry(entry, pod.netns)
                if error:
                    failed_checks[key_of(entry)] = error
        finally:
            PLUGIN_NICE.reset(niced)
        verdicts = verdicts_of(c, failed_checks)
        damaged = [
            e for e in c.entries if key_of(e) in {key_of(d) for d in c.damaged} or key_of(e) in failed_checks
        ]
        wrong = [f"{n}/{i}: {c.findings[(n, i)].reason}" for n, i in map(key_of, c.damaged)]
        wrong += [f"{n}/{i}: CHECK failed: {err}" for (n, i), err in failed_checks.items()]
        wrong += [f"{n}/{i}: not attached" for n, i in map(selected_key, c.missing)]
        mismatch = ip_mismatch(self.mode, c)
        if mismatch:
            wrong.append(mismatch)
        if not wrong:
            self._retries.pop(pod.id, None)
            self.roster.settled(pod.id)
            if c.unreadable:
                return self._unreadable(pod, c, verdicts)
            return self._ok(pod, verdicts)
        what = "; ".join(wrong)
        if (
            not c.entries
            and not pod.ips
            and self.mode.runtime_reports_our_ips
            and self.mode.adds_behind_runtime
        ):
            # shim mode, nothing of ours and no IP the runtime reports: no network it knows of
            # to make true (a pod in creation, or one the runtime never networked) ...
            if not self.roster.record(pod.id).relisted:
                return None
            # ... or one whose network the runtime deleted (its CNI DEL) before a restart cut
            # its stop short: listed READY again, with no IP, which a new ADD would not change
            reason = (
                f"{what}: the runtime deleted its network and, restarted, lists it READY without "
                "an IP; stop or delete the pod"
            )
            return self._broken(pod, BrokenCode.TORN_DOWN, reason, verdicts)
        readd: dict[Key, tuple[str, ...]] = {}
        if (
            self.mode.runtime_reports_our_ips
            and not self.mode.adds_behind_runtime
            and (c.missing or mismatch)
        ):
            readd = native_readd(c, mismatch)
            if not readd:
                reason = missed_reason(self.roster.record(pod.id), c, mismatch, ADMIN_ACTION)
                self.roster.settled(pod.id)  # nothing to retry: it is reported instead
                return self._broken(pod, BrokenCode.MISSED, reason, verdicts)
        if self.cfg.repair != "on":
            reason = f"{what} (repair is {self.cfg.repair}: nothing was changed)"
            return self._broken(pod, BrokenCode.REPAIR_OFF, reason, verdicts)
        primary = primary_key(self.mode, c)
        retry = self._retries.setdefault(pod.id, Retry())
        if retry.failures and self.clock() < retry.next_at and not explicit:
            return self.health.get(pod.id)  # backing off
        ips = dict(retry.ips) | readd
        for entry in damaged:
            ips.setdefault(key_of(entry), result_ips(entry))
        if (
            primary is not None
            and pod.ips
            and self.mode.runtime_reports_our_ips
            and self.mode.adds_behind_runtime
        ):
            # shim mode: the runtime's IPs are eth0's, and what it reports is what the repair
            # makes true (native mode's are every network's: each asks for its own, equal ones)
            ips[primary] = pod.ips
        if mismatch and primary is not None:
            damaged += [e for e in c.entries if key_of(e) == primary and e not in damaged]
        retry.ips = {k: v for k, v in ips.items() if v}
        try:
            async with self._repairing:  # one at a time, also when pods settle at once
                await self.plan.repair(
                    pod,
                    selected=repair_selection(c.selected, c.entries, map(key_of, damaged)),
                    damaged=damaged,
                    ips=retry.ips,
                    wrong=wrong,
                    runtime_primary=self.mode.runtime_primary(pod),
                )
        except IpTaken as exc:
            self._failed(retry)
            reason = f"{what}; {exc}: never taken from it; {ADMIN_ACTION}"
            return self._broken(pod, BrokenCode.IP_TAKEN, reason, verdicts)
        except IpsNotRequestable as exc:
            self.roster.settled(pod.id)  # nothing was touched, nothing to retry
            reason = f"{what}; {exc}; {ADMIN_ACTION}"
            return self._broken(pod, BrokenCode.IPS_NOT_REQUESTABLE, reason, verdicts)
        except NriCniError as exc:
            return self._repair_failed(pod, retry, what, str(exc), verdicts)
        after = self._plan(pod, self.plan.cached(pod.id))
        await self._inspect([after])
        if after.damaged or after.missing:
            still = "; ".join(f.reason for f in after.findings.values() if f.damaged) or "networks missing"
            return self._repair_failed(pod, retry, what, f"still differs after the repair: {still}", verdicts)
        self._retries.pop(pod.id, None)
        self.roster.settled(pod.id)
        log.info("pod %s id=%s repaired: %s", pod.label(), pod.id, what)
        return self.health.repaired(pod.id, what, verdicts_of(after, {}))

    def _unreadable(self, pod: PodInfo, c: PodCheck, verdicts: list[AttachmentVerdict]) -> PodHealth:
        """Something the pod needs could not be read: unknown is not ok, nothing is changed."""
        return self._broken(pod, BrokenCode.UNREADABLE, unreadable_reason(c, ADMIN_ACTION), verdicts)

    def _netns_unreadable(self, pod: PodInfo, entries: list[CacheEntry]) -> PodHealth:
        """The runtime lists the pod, its pause process runs, its netns path is no netns."""
        self._retries.pop(pod.id, None)
        why, verdicts = netns_unreadable(pod, attach_order(entries))
        return self._broken(pod, BrokenCode.NETNS_UNREADABLE, f"{why}; {ADMIN_ACTION}", verdicts)

    def _failed(self, retry: Retry) -> None:
        retry.failed(self.clock(), FIRST_RETRY, (self.cfg.verify_interval or 30.0) * BACKOFF_CAP)

    def _repair_failed(
        self, pod: PodInfo, retry: Retry, what: str, error: str, verdicts: list[AttachmentVerdict]
    ) -> PodHealth | None:
        self._failed(retry)
        if retry.failures < MAX_FAILURES:
            log.warning(
                "pod %s id=%s: repair failed (try %d of %d, again in %.0f s): %s",
                pod.label(),
                pod.id,
                retry.failures,
                MAX_FAILURES,
                retry.next_at - self.clock(),
                error,
            )
            return self.health.get(pod.id)
        reason = f"{what}; repair failed {retry.failures} times, the last: {error} (retried with backoff)"
        return self._broken(pod, BrokenCode.REPAIR_FAILED, reason, verdicts)

    def _ok(self, pod: PodInfo, verdicts: list[AttachmentVerdict]) -> PodHealth:
        return self.health.ok(pod.id, verdicts, label=pod.label())

    def _broken(
        self, pod: PodInfo, code: BrokenCode, reason: str, verdicts: list[AttachmentVerdict]
    ) -> PodHealth:
        return self.health.broken(pod.id, code, reason, verdicts, label=f"{pod.namespace}/{pod.name}")
