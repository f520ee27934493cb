"""What the runtime reports of a pod's IPs against nri-cni's records (verify's IP reasoning).

Shim mode: the runtime's IPs must be eth0's. Native mode: every IP nri-cni answered must be
among the runtime's, and a pod that lacks one network while the runtime lists IPs no other
attachment holds gets that network again with them; else it is "missed".
"""

from __future__ import annotations

from nri_cni.pod.repair import plain, result_ips
from nri_cni.service.modes import Mode
from nri_cni.service.podcheck import Key, PodCheck, key_of, selected_key
from nri_cni.service.roster import PodRecord


def primary_key(mode: Mode, c: PodCheck) -> Key | None:
    """nri-cni's primary attachment of the pod (eth0), when the primary is nri-cni's."""
    if not mode.primary.ours or not c.selected:
        return None
    return selected_key(c.selected[0])


def ip_mismatch(mode: Mode, c: PodCheck) -> str:
    """What differs between the IPs the runtime reports and nri-cni's primary (shim: the
    runtime's IPs must be eth0's; native: eth0's must be among the runtime's)."""
    primary = primary_key(mode, c)
    if not mode.runtime_reports_our_ips or primary is None:
        return ""
    entry = next((e for e in c.entries if key_of(e) == primary), None)
    if entry is None or entry.result is None:
        return ""
    ours = {plain(a) for a in result_ips(entry)}
    theirs = set(c.pod.ips)
    if mode.adds_behind_runtime:
        if theirs and not theirs <= ours:
            return f"the runtime reports {', '.join(c.pod.ips)}; {primary[1]} has {', '.join(sorted(ours))}"
        return ""
    if not ours <= theirs:
        shown = ", ".join(c.pod.ips) or "no IP"
        return f"the runtime reports {shown}; nri-cni gave it {', '.join(sorted(ours))}"
    return ""


def runtime_network_lost(mode: Mode, record: PodRecord, c: PodCheck) -> str:
    """Secondary mode: a pod with nri-cni's networks that the runtime listed with IPs and now
    lists without has lost the runtime's own network, or the runtime its record of it: CRI-O
    restarted in the middle of the pod's stop (after its CNI DEL) lists such a pod READY
    without an IP. "" otherwise."""
    if mode.primary.ours or not c.entries or c.pod.ips or not record.ips_lost:
        return ""
    return (
        "the runtime reports no IP for it: its own network of the pod is gone or unknown to it "
        "(a runtime restarted in the middle of the pod's stop or creation lists it READY without an "
        "IP); nri-cni keeps its networks while the runtime lists the pod"
    )


def native_readd(c: PodCheck, mismatch: str) -> dict[Key, tuple[str, ...]]:
    """Native mode: the one network a pod lacks, with the IPs the runtime lists and no other
    attachment holds ({} if none). A native runtime runs no CNI: an IP it lists came from
    nri-cni's answer, so the pod lost that network since (an ADD or repair cut by a crash and
    rolled back); asking for those IPs makes what the runtime reports true again. With two
    missing, whose IP is whose cannot be told: "missed"."""
    if mismatch or len(c.missing) != 1 or not c.pod.ips:
        return {}
    held = {plain(a) for e in c.entries for a in result_ips(e)}
    left = tuple(ip for ip in c.pod.ips if plain(ip) not in held)
    return {selected_key(c.missing[0]): left} if left else {}


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
        names = ", ".join(f"{n}/{i}" for n, i in map(selected_key, c.missing))
        why = f"it lacks {names}, and the runtime learns IPs only from RunPodSandbox"
    return f"missed: {why}; {action}"
