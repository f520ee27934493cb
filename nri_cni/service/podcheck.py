"""One pod in one verify round (service/verify.py): its records, what the node showed, what it
lacks, and the per-attachment verdicts the health book keeps."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from nri_cni.cni.cache import CacheEntry
from nri_cni.node import Expectation, Finding, FindingKind, expectation_from_result, with_host_side
from nri_cni.pod.model import Key, PodInfo
from nri_cni.pod.select import Selected
from nri_cni.service.podstate import AttachmentVerdict, BrokenCode

T = TypeVar("T")
R = TypeVar("R")

# attachment verdicts for a cache entry nothing could be compared with (never "ok")
NO_RESULT = "no-result"
BAD_RESULT = "bad-result"


@dataclass
class PodCheck:
    """One pod in one round: its records, what netlink showed, what it lacks."""

    pod: PodInfo
    entries: list[CacheEntry]  # nri-cni's attachments, attach order
    selected: list[Selected]  # what it should have ([] when the config refuses it now)
    expectations: list[tuple[CacheEntry, Expectation]] = field(default_factory=list)
    findings: dict[Key, Finding] = field(default_factory=dict)
    # attachments nothing could be compared for: key -> (verdict kind, why): a cache entry
    # without a result ("no-result") or with one that cannot be read ("bad-result")
    unknown: dict[Key, tuple[str, str]] = field(default_factory=dict)
    path_gone: bool = False  # its netns path is gone (the round did not read the node)

    @property
    def missing(self) -> list[Selected]:
        have = {e.key for e in self.entries}
        return [s for s in self.selected if s.key not in have]

    @property
    def damaged(self) -> list[CacheEntry]:
        return [e for e in self.entries if (f := self.findings.get(e.key)) is not None and f.damaged]

    @property
    def unreadable(self) -> list[str]:
        """What could not be read or compared, one line per attachment ([] when everything
        was): never "ok"."""
        out = [f"{n}/{i}: {why}" for (n, i), (_, why) in self.unknown.items()]
        for (n, i), f in self.findings.items():
            out += [f"{n}/{i}: {d.reason}" for d in f.differences if d.kind is FindingKind.UNREADABLE]
        return out

    @property
    def netns_gone(self) -> bool:
        return self.path_gone or any(f.kind is FindingKind.NETNS_GONE for f in self.findings.values())

    def signature(self) -> list[tuple[Key, object]]:
        return [(e.key, e.result) for e in self.entries]


def expect(check: PodCheck, *, host_side: bool = True) -> None:
    """What the node should show for each of the check's entries, from its cached result:
    `check.expectations`, or `check.unknown` for an entry nothing can be compared with.
    `host_side`: also portmap's DNAT, the masquerade and host-local's leases (read once a round by verify)."""
    pod = check.pod
    for entry in check.entries:
        if entry.result is None:  # nothing recorded to compare with: unknown, never ok
            why = f"nri-cni's cache entry ({entry.path or 'no file'}) holds no result: nothing to compare with"  # fmt: skip
            check.unknown[entry.key] = (NO_RESULT, why)
            continue
        try:
            exp = expectation_from_result(
                entry.result, key=f"{pod.id}/{entry.network_name}/{entry.ifname}", netns=pod.netns,
                ifname=entry.ifname,
            )  # fmt: skip
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            why = f"the cached result ({entry.path or 'no file'}) cannot be read: {exc!r}"
            check.unknown[entry.key] = (BAD_RESULT, why)
            continue
        exp = dataclasses.replace(exp, container_id=entry.container_id)
        if host_side:
            try:
                # portmap's DNAT, the plugin's masquerade, host-local's leases
                exp = with_host_side(exp, entry.config, entry.capability_args, entry.container_id)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # the pod's side is still checked
                why = f"what the chain made on the host cannot be told from the cached config: {exc!r}"
                check.unknown[entry.key] = (FindingKind.UNREADABLE.value, why)
        check.expectations.append((entry, exp))


@dataclass
class Retry:
    failures: int = 0
    next_at: float = 0.0
    ips: dict[Key, tuple[str, ...]] = field(default_factory=dict)  # asked for, kept across tries

    def failed(self, now: float, first: float, longest: float) -> None:
        """One more failure: the next try after `first` seconds, doubling, at most `longest`."""
        self.failures += 1
        self.next_at = now + min(first * 2 ** (self.failures - 1), longest)


def verdicts_of(c: PodCheck, failed_checks: dict[Key, str]) -> list[AttachmentVerdict]:
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
    out += [AttachmentVerdict(n, i, "missing", "not attached") for n, i in (s.key for s in c.missing)]
    return out


def build_check(pod: PodInfo, entries: list[CacheEntry], selected: list[Selected]) -> PodCheck:
    """The pod's round: an expectation per cache entry (`entries` in attach order) from its
    result, with the host side its chain made (portmap's DNAT, host-local's leases); an entry
    nothing can be compared for is "unknown", never ok (`expect`)."""
    check = PodCheck(pod, entries, selected)
    expect(check)
    return check


def check_parallel() -> int:
    """CHECKs of intact pods a verify round runs at once: a CHECK is mostly its plugins' CPU
    (bridge, portmap's iptables), so a couple per CPU (one at a time, the 50 CHECKs of a round
    over 500 pods took 2.2 s)."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


async def at_once(items: Sequence[T], fn: Callable[[T], Awaitable[R]], parallel: int) -> list[R]:
    """fn(item) for every item, `parallel` at a time, the results in the items' order; every
    call runs to its end, then the first error is raised."""
    slots = asyncio.Semaphore(parallel)

    async def one(item: T) -> R:
        async with slots:
            return await fn(item)

    done = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    out: list[R] = []
    for result in done:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out


def unreadable_reason(c: PodCheck, admin_action: str) -> str:
    """Why a pod with unreadable parts is not verified. Nothing is changed on a guess; the
    next round reads again (a passing netlink error clears by itself)."""
    return (
        "; ".join(c.unreadable) + ": not verified, nothing was changed; read again every round "
        "(if it stays: nri-cni pods and the daemon log say what failed; a cache entry without a "
        f"usable result cannot be repaired: {admin_action})"
    )


def netns_unreadable(pod: PodInfo, entries: Sequence[CacheEntry]) -> tuple[str, list[AttachmentVerdict]]:
    """The reason and verdicts of a pod the runtime lists, whose pause process runs, but whose
    netns path is gone or no network namespace: nothing can be read or repaired through that
    path, and nothing is released (the pod may still work); reported until the runtime drops it."""
    why = (
        f"its netns path {pod.netns} is gone or is no network namespace, while its pause "
        f"process {pod.pid} runs and the runtime lists it: nri-cni can neither read nor "
        "repair its networks and keeps its IPs held"
    )
    code = BrokenCode.NETNS_UNREADABLE.value
    return why, [AttachmentVerdict(e.network_name, e.ifname, code, why) for e in entries]
