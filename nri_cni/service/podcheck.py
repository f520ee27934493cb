"""One pod in one verify round (service/verify.py): its records, what the node showed and what
it lacks, read once into a frozen `PodCheck` (`read_checks`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nri_cni.cni.cache import CacheEntry
from nri_cni.node import (
    Expectation,
    Finding,
    FindingKind,
    NodeInspector,
    expectation_from_result,
    with_host_side,
)
from nri_cni.pod.model import Key, PodInfo
from nri_cni.pod.select import Selected
from nri_cni.service.podstate import AttachmentVerdict, BrokenCode

# attachment verdicts for a cache entry nothing could be compared with (never "ok")
NO_RESULT = "no-result"
BAD_RESULT = "bad-result"


@dataclass(frozen=True)
class PodCheck:
    """One pod in one round, as read (`pod_check`): its records, what netlink showed and what
    that comes to, each a plain field computed once."""

    pod: PodInfo
    entries: list[CacheEntry]  # nri-cni's attachments, attach order
    selected: list[Selected]  # what it should have ([] when the config refuses it now)
    findings: dict[Key, Finding]
    # attachments nothing could be compared for: key -> (verdict kind, why): a cache entry
    # without a result ("no-result") or with one that cannot be read ("bad-result")
    unknown: dict[Key, tuple[str, str]]
    missing: list[Selected]  # selected and not attached
    damaged: list[CacheEntry]  # attached, and netlink finds them damaged
    unreadable: list[str]  # what could not be read or compared, one line each: never "ok"
    netns_gone: bool  # its netns path is gone (nothing read), or netlink found its netns gone


def pod_check(
    pod: PodInfo,
    entries: Sequence[CacheEntry],
    selected: Sequence[Selected],
    findings: Mapping[Key, Finding] | None = None,
    unknown: Mapping[Key, tuple[str, str]] | None = None,
    *,
    path_gone: bool = False,
) -> PodCheck:
    """The pod's reading from its records (`entries` in attach order), what it should have,
    netlink's findings and the attachments nothing could be compared for."""
    found, unknown = dict(findings or {}), dict(unknown or {})
    have = {e.key for e in entries}
    unreadable = [f"{n}/{i}: {why}" for (n, i), (_, why) in unknown.items()]
    for (n, i), f in found.items():
        unreadable += [f"{n}/{i}: {d.reason}" for d in f.differences if d.kind is FindingKind.UNREADABLE]
    return PodCheck(
        pod,
        list(entries),
        list(selected),
        found,
        unknown,
        missing=[s for s in selected if s.key not in have],
        damaged=[e for e in entries if (g := found.get(e.key)) is not None and g.damaged],
        unreadable=unreadable,
        netns_gone=path_gone or any(f.kind is FindingKind.NETNS_GONE for f in found.values()),
    )


@dataclass(frozen=True)
class ToRead:
    """A pod a round reads: its cache entries (attach order), what it should have, and whether
    its netns path is gone (then nothing is read of it)."""

    pod: PodInfo
    entries: list[CacheEntry]
    selected: list[Selected]
    path_gone: bool = False


async def read_checks(
    inspector: NodeInspector, pods: Sequence[ToRead], *, host_side: bool = True
) -> list[PodCheck]:
    """Each pod's reading: an expectation per cache entry with a readable result
    (`expectations`), one netlink read for all of them, the findings per pod."""
    planned = [([], {}) if p.path_gone else expectations(p.pod, p.entries, host_side=host_side) for p in pods]
    exps = [e for plan, _ in planned for _, e in plan]
    found = iter(await inspector.inspect(exps) if exps else [])
    out = []
    for p, (plan, unknown) in zip(pods, planned, strict=True):
        findings = {entry.key: next(found) for entry, _ in plan}
        out.append(pod_check(p.pod, p.entries, p.selected, findings, unknown, path_gone=p.path_gone))
    return out


async def node_shows(inspector: NodeInspector, pod: PodInfo, entries: Sequence[CacheEntry]) -> bool:
    """Whether netlink shows each of `entries` as its result says (the pod's links up with
    their addresses and routes, their host-side links): nothing unreadable, nothing differs.
    The host's rules and leases are not read (no iptables-save): a cheap look, for a CHECK
    answered from the records, through the pods' own pool (`inspector`)."""
    (c,) = await read_checks(inspector, [ToRead(pod, list(entries), [])], host_side=False)
    return not c.unknown and len(c.findings) == len(entries) and all(f.ok for f in c.findings.values())


def expectations(
    pod: PodInfo, entries: Sequence[CacheEntry], *, host_side: bool = True
) -> tuple[list[tuple[CacheEntry, Expectation]], dict[Key, tuple[str, str]]]:
    """What the node should show for each of the pod's entries, from its cached result, and
    the entries nothing can be compared with (`PodCheck.unknown`). `host_side`: also portmap's
    DNAT, the masquerade and host-local's leases (read once a round by verify)."""
    out: list[tuple[CacheEntry, Expectation]] = []
    unknown: dict[Key, tuple[str, str]] = {}
    for entry in entries:
        if entry.result is None:  # nothing recorded to compare with: unknown, never ok
            why = f"nri-cni's cache entry ({entry.path or 'no file'}) holds no result: nothing to compare with"  # fmt: skip
            unknown[entry.key] = (NO_RESULT, why)
            continue
        try:
            exp = expectation_from_result(
                entry.result, key=f"{pod.id}/{entry.network_name}/{entry.ifname}", netns=pod.netns,
                ifname=entry.ifname,
            )  # fmt: skip
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            why = f"the cached result ({entry.path or 'no file'}) cannot be read: {exc!r}"
            unknown[entry.key] = (BAD_RESULT, why)
            continue
        exp = dataclasses.replace(exp, container_id=entry.container_id)
        if host_side:
            try:
                # portmap's DNAT, the plugin's masquerade, host-local's leases
                exp = with_host_side(exp, entry.config, entry.capability_args, entry.container_id)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # the pod's side is still checked
                why = f"what the chain made on the host cannot be told from the cached config: {exc!r}"
                unknown[entry.key] = (FindingKind.UNREADABLE.value, why)
        out.append((entry, exp))
    return out, unknown


@dataclass
class Retry:
    failures: int = 0
    next_at: float = 0.0
    ips: dict[Key, tuple[str, ...]] = field(default_factory=dict)  # asked for, kept across tries

    def failed(self, now: float, first: float, longest: float) -> None:
        """One more failure: the next try after `first` seconds, doubling, at most `longest`."""
        self.failures += 1
        self.next_at = now + min(first * 2 ** (self.failures - 1), longest)


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
