"""What the node really holds for a pod, read with netlink (pyroute2) inside the pod's netns, set
against what the runtime reports: the acceptance check of the fault tests.

"Whole" means: the netns holds exactly the interfaces the pod should have (besides lo), each with
an address, and the runtime's IPs for the pod are on those interfaces. A problem is a sentence
naming the pod, so a failing test says which pod and what is wrong.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from tests.support.netns import list_links


@dataclass(frozen=True)
class RuntimePod:
    """One pod as the runtime lists it."""

    id: str
    netns: str
    ips: tuple[str, ...]  # the IPs the runtime reports (without prefix)


def pod_interfaces(netns: str) -> dict[str, list[str]]:
    """ifname -> global addresses ("ip/prefix") of every link but lo in the netns."""
    out = {}
    for link in list_links(netns):
        if link.name == "lo":
            continue
        out[link.name] = [a for a in link.addrs if not ipaddress.ip_interface(a).is_link_local]
    return out


def whole_problems(pod: RuntimePod, interfaces: Iterable[str]) -> list[str]:
    """What differs between `pod` as the runtime reports it and its netns (empty: whole)."""
    want = sorted(interfaces)
    try:
        have = pod_interfaces(pod.netns)
    except Exception as exc:  # no netns at all is a problem of its own, named
        return [f"pod {pod.id[:12]}: netns {pod.netns} unreadable: {exc}"]
    problems = []
    if sorted(have) != want:
        problems.append(f"pod {pod.id[:12]}: interfaces {sorted(have)}, wanted {want}")
    for ifname, addrs in have.items():
        if not addrs:
            problems.append(f"pod {pod.id[:12]}: {ifname} has no address")
    on_node = {str(ipaddress.ip_interface(a).ip) for addrs in have.values() for a in addrs}
    for ip in pod.ips:
        if ip not in on_node:
            problems.append(f"pod {pod.id[:12]}: the runtime reports {ip}, the netns has {sorted(on_node)}")
    if not pod.ips:
        problems.append(f"pod {pod.id[:12]}: the runtime reports no IP")
    return problems


def ip_of(pod: RuntimePod, ifname: str = "eth0") -> str:
    """The address of `ifname` in the pod's netns (the first), without prefix."""
    return str(ipaddress.ip_interface(pod_interfaces(pod.netns)[ifname][0]).ip)


def reaches(pod: RuntimePod, ip: str) -> bool:
    """One ping from inside `pod`'s netns to `ip` (a pod of the same test bridge) answered."""
    proc = subprocess.run(
        ["nsenter", f"--net={pod.netns}", "ping", "-c", "1", "-W", "2", ip],
        capture_output=True,
        timeout=10,
    )
    return proc.returncode == 0
