"""Fill in what a plugin's result left out (MAC, MTU) from the pod's network namespace.

pyroute2 spends ~10 ms per namespace query here, most of a pod's budget; this costs ~0.2 ms: a
short-lived thread enters the pod's netns (setns changes only the calling thread; the entry is
node/workers.py's, the one way into a netns), opens a UDP socket there (a socket stays in the
namespace it was created in), and asks the kernel with the SIOCGIFHWADDR / SIOCGIFMTU ioctls.
The thread never returns to the daemon's pool, so a failure to switch back cannot leave any
other work in the pod's namespace.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct

from nri_cni.cni.result import Result
from nri_cni.node.workers import socket_in_netns

log = logging.getLogger(__name__)

SIOCGIFHWADDR = 0x8927
SIOCGIFMTU = 0x8921
_IFREQ = 40  # struct ifreq: 16-byte name + 24-byte union


def _socket_in_netns(netns: str) -> socket.socket:
    """A UDP socket that lives in `netns` (made through the one netns entry, node/workers.py)."""
    return socket_in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))


def interface_details(netns: str, ifnames: list[str]) -> dict[str, tuple[str, int]]:
    """{ifname: (mac, mtu)} for the interfaces of `netns` that exist."""
    out: dict[str, tuple[str, int]] = {}
    sock = _socket_in_netns(netns)
    try:
        for name in ifnames:
            req = struct.pack("16s24x", name.encode()[:15])
            try:
                hw = fcntl.ioctl(sock.fileno(), SIOCGIFHWADDR, req)
                mtu_raw = fcntl.ioctl(sock.fileno(), SIOCGIFMTU, req)
            except OSError:
                continue  # not there (yet, or any more): leave the result as it is
            mac = ":".join(f"{b:02x}" for b in hw[18:24])
            (mtu,) = struct.unpack_from("i", mtu_raw, 16)
            out[name] = (mac, mtu)
    finally:
        sock.close()
    return out


async def fill_interface_details(netns: str, result: Result) -> Result:
    """Returns `result` with MAC and MTU set on its in-pod interfaces where the plugin left
    them out. Best effort: a netns that is gone leaves the result unchanged."""
    missing = [i for i in result.interfaces if i.sandbox and (not i.mac or not i.mtu)]
    if not missing or not netns:
        return result
    try:
        details = await asyncio.to_thread(interface_details, netns, [i.name for i in missing])
    except OSError as exc:
        log.debug("cannot read interface details in %s: %s", netns, exc)
        return result
    for iface in missing:
        if iface.name in details:
            mac, mtu = details[iface.name]
            iface.mac = iface.mac or mac
            iface.mtu = iface.mtu or mtu
    return result
