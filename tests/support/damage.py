"""External damage to a pod's network, the way something else on the node does it (an admin,
NetworkManager): the CNI bridge deleted, the pod's host veth deleted, its interface deleted, or
its addresses flushed. Only links of the test's own pods and bridge are touched (netlink,
pyroute2). Then the check that the damage is gone: the pod's interfaces hold the addresses they
held before, and the host end of each veth is a port of its bridge again.
"""

from __future__ import annotations

import os
import subprocess

from pyroute2 import IPRoute

from nri_cni.node.hostside import parse_iptables_dnat
from tests.support.netns import LinkInfo, delete_link, get_link, list_links, netns_name
from tests.support.podtruth import RuntimePod, pod_interfaces

KINDS = ["bridge-deleted", "host-veth-deleted", "pod-link-deleted", "address-flushed"]


def host_peer(netns: str, ifname: str) -> LinkInfo | None:
    """The host end of the veth whose pod end is `ifname` in `netns` (None: there is none)."""
    inside = get_link(ifname, netns)
    if inside is None or inside.peer_index is None:
        return None
    return next((li for li in list_links() if li.index == inside.peer_index and li.kind == "veth"), None)


def flush_addresses(netns: str, ifname: str) -> None:
    with IPRoute(netns=netns_name(netns)) as ipr:
        [idx] = ipr.link_lookup(ifname=ifname)
        for msg in ipr.get_addr(index=idx):
            ipr.addr("del", index=idx, address=msg.get_attr("IFA_ADDRESS"), prefixlen=msg["prefixlen"])


def _tables(family: int) -> str:
    return "iptables" if family == 4 else "ip6tables"


def dnat_ports(pod_id: str, family: int = 4) -> set[tuple[str, int]]:
    """{(proto, hostPort)} of the DNAT rules of that IP family portmap made for `pod_id`."""
    text = subprocess.run(
        [f"{_tables(family)}-save", "-t", "nat"], capture_output=True, text=True, check=True
    ).stdout
    return parse_iptables_dnat(text).get(pod_id, set())


def flush_dnat(pod_id: str, family: int = 4) -> None:
    """What a firewall reload does to one pod: its CNI-DN chain of that IP family emptied and its
    jump gone (only this pod's rules: the machine's other rules are not ours)."""
    tables = _tables(family)
    text = subprocess.run([f"{tables}-save", "-t", "nat"], capture_output=True, text=True, check=True).stdout
    jumps = [line for line in text.splitlines() if line.startswith("-A CNI-HOSTPORT-DNAT") and pod_id in line]
    assert jumps, text
    for line in jumps:
        chain = line.rsplit("-j ", 1)[1].split()[0]
        subprocess.run([tables, "-t", "nat", "-F", chain], check=True)
        rule = line.split(None, 2)[2]
        subprocess.run(["sh", "-c", f"{tables} -t nat -D CNI-HOSTPORT-DNAT {rule}"], check=True)
    assert dnat_ports(pod_id, family) == set()


def damage(kind: str, pod: RuntimePod, ifname: str, bridge: str) -> None:
    """Does `kind` to `pod`'s `ifname` (on `bridge`)."""
    if kind == "bridge-deleted":
        peer = host_peer(pod.netns, ifname)
        bridge_link = get_link(bridge)
        assert peer is not None and bridge_link is not None and peer.master == bridge_link.index
        assert delete_link(bridge)
    elif kind == "host-veth-deleted":
        peer = host_peer(pod.netns, ifname)
        assert peer is not None, f"pod {pod.id[:12]}: no host veth for {ifname}"
        assert delete_link(peer.name)
    elif kind == "pod-link-deleted":
        assert delete_link(ifname, pod.netns)
    elif kind == "address-flushed":
        flush_addresses(pod.netns, ifname)
    else:
        raise ValueError(kind)


def damage_left(pod: RuntimePod, before: dict[str, list[str]], bridged: list[str], bridge: str) -> list[str]:
    """What still differs from `before` (ifname -> addresses, read before the damage); the
    `bridged` interfaces must have their host end on `bridge`."""
    try:
        now = pod_interfaces(pod.netns)
    except Exception as exc:
        return [f"pod {pod.id[:12]}: netns unreadable: {exc}"]
    problems = []
    if {k: sorted(v) for k, v in now.items()} != {k: sorted(v) for k, v in before.items()}:
        problems.append(f"pod {pod.id[:12]}: {now}, before the damage {before}")
    bridge_link = get_link(bridge)
    for ifname in bridged:
        peer = host_peer(pod.netns, ifname) if ifname in now else None
        if bridge_link is None:
            problems.append(f"bridge {bridge} is missing")
        elif peer is None or peer.master != bridge_link.index:
            problems.append(f"pod {pod.id[:12]}: the host end of {ifname} is not on {bridge}")
    return problems


def unmount_netns_path(path: str) -> None:
    """The pod's netns path gone while its namespace lives on (held by the pause process)."""
    # detached (MNT_DETACH), as `ip netns delete` and containerd remove a netns: a plain umount
    # is refused (EBUSY) while anyone has the path open, nri-cni's verify reading it included
    done = subprocess.run(["umount", "--lazy", path], capture_output=True, text=True)
    if done.returncode != 0:
        mounts = subprocess.run(["findmnt", "-n", path], capture_output=True, text=True).stdout.strip()
        raise AssertionError(
            f"umount {path}: exit {done.returncode}: {done.stderr.strip()}; mounted: {mounts!r}"
        )
    os.unlink(path)
