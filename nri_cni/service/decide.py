"""What one pod's verify round decides, as a pure function of what the round read.

A round reads (the records, netlink, the CHECKs that were due, whether the pause process
runs: `Reading`; the mode's reading of the runtime's IPs: `RuntimeIps`),
`decide(check, record, ips, policy)` returns a `Verdict` (what to report,
nothing changed on the node) or a `RepairOrder` (what a repair must DEL and ask for), and the
round applies it under the pod's lock (service/verify.py). After a repair, `judge_repair` says
what it came to. docs/reliability.md has each outcome per finding kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nri_cni.cni.cache import CacheEntry
from nri_cni.pod.repair import result_ips
from nri_cni.service.modes import RuntimeIps
from nri_cni.service.podcheck import (
    Key,
    PodCheck,
    Retry,
    netns_unreadable,
    unreadable_reason,
)
from nri_cni.service.podstate import BrokenCode, PodState
from nri_cni.service.roster import PodRecord

MAX_FAILURES = 3  # failed repairs in a row before the pod is reported broken
ADMIN_ACTION = "delete the pod (kubectl delete pod); kubelet creates it again with its networks"


@dataclass(frozen=True)
class Reading:
    """What the round read of one pod: its check (records and netlink), the CHECKs that
    failed (key -> the plugin's error), and whether its pause process runs."""

    check: PodCheck
    failed_checks: Mapping[Key, str] = field(default_factory=dict)
    running: bool = True


@dataclass(frozen=True)
class Policy:
    repair: str  # "on", "verify-only", "off"
    retry: Retry | None  # the pod's failed repairs in a row, if any
    now: float
    explicit: bool  # the round was asked for this pod by name: no backoff wait


@dataclass(frozen=True)
class Verdict:
    """What the round reports of the pod; `state` None: nothing this round (`why`)."""

    state: PodState | None
    code: BrokenCode | None = None
    reason: str = ""
    why: str = ""
    ends_retries: bool = False  # the pod's failed repairs are forgotten
    settles: bool = False  # no attach retry is left (Roster.settled)
    stands: bool = False  # (state None) the pod's last verdict stands: a repair is still retried


@dataclass(frozen=True)
class RepairOrder:
    damaged: tuple[CacheEntry, ...]  # DELed first
    ips: Mapping[Key, tuple[str, ...]]  # asked for, per network
    wrong: tuple[str, ...]

    @property
    def what(self) -> str:
        return "; ".join(self.wrong)


def _broken(code: BrokenCode, reason: str, *, ends_retries: bool = False, settles: bool = False) -> Verdict:
    return Verdict(PodState.BROKEN, code, reason, ends_retries=ends_retries, settles=settles)


def _left(why: str) -> Verdict:
    return Verdict(None, why=why)


def wrong_of(c: PodCheck, failed_checks: Mapping[Key, str], mismatch: str) -> list[str]:
    """What differs, one line each: netlink's findings, failed CHECKs, networks not attached,
    the runtime's IPs against the records."""
    wrong = [f"{n}/{i}: {c.findings[(n, i)].reason}" for n, i in (e.key for e in c.damaged)]
    wrong += [f"{n}/{i}: CHECK failed: {err}" for (n, i), err in failed_checks.items()]
    wrong += [f"{n}/{i}: not attached" for n, i in (s.key for s in c.missing)]
    return wrong + ([mismatch] if mismatch else [])


def decide(check: Reading, record: PodRecord, ips: RuntimeIps, policy: Policy) -> Verdict | RepairOrder:
    c = check.check
    if record.pod is None:
        return _left("not listed by the runtime")
    if record.stopped:
        return _left("torn down while the round read it: never attached again")
    if c.netns_gone:
        if check.running:
            why, _ = netns_unreadable(c.pod, c.entries)
            return _broken(BrokenCode.NETNS_UNREADABLE, f"{why}; {ADMIN_ACTION}", ends_retries=True)
        return _left("its netns is gone and its pause process too: the reaper's")
    if ips.lost:  # not nri-cni's network: nothing to repair; its own are kept while it is listed
        return _broken(BrokenCode.TORN_DOWN, f"{ips.lost}; {ADMIN_ACTION}", ends_retries=True)
    wrong = wrong_of(c, check.failed_checks, ips.mismatch)
    if not wrong:
        if c.unreadable:
            reason = unreadable_reason(c, ADMIN_ACTION)
            return _broken(BrokenCode.UNREADABLE, reason, ends_retries=True, settles=True)
        return Verdict(PodState.OK, ends_retries=True, settles=True)
    return _differs(check, record, ips, policy, wrong)


def _differs(
    check: Reading, record: PodRecord, ips: RuntimeIps, policy: Policy, wrong: list[str]
) -> Verdict | RepairOrder:
    c, what = check.check, "; ".join(wrong)
    if ips.nothing_to_make_true:
        if not record.relisted:  # a pod in creation, or one the runtime never networked
            return _left("nothing of nri-cni's and no IP the runtime reports: nothing to make true")
        # one whose network the runtime deleted (its CNI DEL) before a restart cut its stop
        # short: listed READY again, with no IP, which a new ADD would not change
        reason = (
            f"{what}: the runtime deleted its network and, restarted, lists it READY without "
            "an IP; stop or delete the pod"
        )
        return _broken(BrokenCode.TORN_DOWN, reason)
    if ips.missed and not ips.readd:  # nothing to retry: it is reported instead
        return _broken(BrokenCode.MISSED, missed_reason(record, c, ips.mismatch, ADMIN_ACTION), settles=True)
    if policy.repair != "on":
        return _broken(BrokenCode.REPAIR_OFF, f"{what} (repair is {policy.repair}: nothing was changed)")
    retry = policy.retry
    if retry is not None and retry.failures and policy.now < retry.next_at and not policy.explicit:
        return Verdict(None, why="backing off after a failed repair", stands=True)
    return RepairOrder(_to_cut(c, check.failed_checks, ips), _ips(check, ips, retry), tuple(wrong))


def _to_cut(c: PodCheck, failed_checks: Mapping[Key, str], ips: RuntimeIps) -> tuple[CacheEntry, ...]:
    """The attachments a repair DELs: damaged, failing CHECK, and the primary when the
    runtime's IPs are not its own."""
    bad = {d.key for d in c.damaged} | set(failed_checks)
    if ips.mismatch and ips.primary is not None:
        bad.add(ips.primary)
    return tuple(e for e in c.entries if e.key in bad)


def _ips(check: Reading, runtime: RuntimeIps, retry: Retry | None) -> dict[Key, tuple[str, ...]]:
    """The addresses the repair asks for, per network: those asked before (kept across
    tries), the native re-ADD's, each damaged attachment's own, and the runtime's IPs for the
    primary when they are eth0's."""
    c = check.check
    ips = dict(retry.ips if retry is not None else {}) | dict(runtime.readd)
    bad = {d.key for d in c.damaged} | set(check.failed_checks)
    for entry in c.entries:
        if entry.key in bad:
            ips.setdefault(entry.key, result_ips(entry))
    if runtime.primary is not None and runtime.primary_ips:
        ips[runtime.primary] = runtime.primary_ips
    return {k: v for k, v in ips.items() if v}


def missed_reason(record: PodRecord, c: PodCheck, mismatch: str, action: str) -> str:
    """Why a native pod is reported missed, in words an admin can act on."""
    late = record.late
    if late and not c.entries:
        why = late
    elif not c.entries and record.attach_failed:
        why = "its attach failed in RunPodSandbox and the runtime kept the pod without networks"
    elif not c.entries:
        why = (
            "the runtime created it without nri-cni's answer (nri-cni was down or killed, or "
            "answered past the NRI request timeout) and nri-cni holds no network of it"
        )
    elif mismatch:
        why = f"the runtime did not take nri-cni's answer ({mismatch}): past the NRI deadline or killed"
    else:
        names = ", ".join(f"{n}/{i}" for n, i in (s.key for s in c.missing))
        why = f"it lacks {names}, and the runtime learns IPs only from RunPodSandbox"
    return f"missed: {why}; {action}"


def judge_repair(after: PodCheck, order: RepairOrder, failures: int, error: str = "") -> Verdict:
    """What a repair came to: `error` (the repair raised), else `after` (the pod read again)
    still differing, are a failure (`failures`: counted with this one); else "repaired"."""
    if not error and (after.damaged or after.missing):
        still = "; ".join(f.reason for f in after.findings.values() if f.damaged) or "networks missing"
        error = f"still differs after the repair: {still}"
    if not error:
        return Verdict(PodState.REPAIRED, reason=order.what, ends_retries=True, settles=True)
    if failures < MAX_FAILURES:
        return Verdict(None, why=f"repair failed (try {failures} of {MAX_FAILURES}): {error}", stands=True)
    reason = f"{order.what}; repair failed {failures} times, the last: {error} (retried with backoff)"
    return _broken(BrokenCode.REPAIR_FAILED, reason)
