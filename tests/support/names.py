"""Names and subnets for what a network test makes: every name starts with ``nct`` and carries a
random suffix, so tests can run beside other tests on the same machine; subnets come from the
test ranges (10.247.0.0/16 .. 10.249.0.0/16) and overlap nothing the host has right now. Also
the error every network helper raises."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable

from pyroute2 import IPRoute

NAME_PREFIX = "nct"
IFNAMSIZ = 15

#: The subnets tests may use (the brief: 10.247.0.0/16 .. 10.249.0.0/16).
TEST_SUPERNETS = tuple(ipaddress.ip_network(f"10.{b}.0.0/16") for b in (247, 248, 249))


class NetTestError(RuntimeError):
    """A helper could not do what it was asked (the message says what and why)."""


def unique_name(tag: str = "", *, length: int = IFNAMSIZ) -> str:
    """A fresh name ``nct<tag><random hex>`` of at most `length` characters (an ifname by default).

    At least 6 random hex digits are kept, so `tag` is cut when it is too long.
    """
    room = length - len(NAME_PREFIX)
    if room < 6:
        raise ValueError("length too small for a unique name")
    tag = tag[: max(0, room - 6)]
    return NAME_PREFIX + tag + "".join(random.choice("0123456789abcdef") for _ in range(room - len(tag)))


def _used_ipv4_networks() -> list[ipaddress.IPv4Network]:
    """Networks routed or addressed on the host (and in every named netns), to avoid collisions."""
    used: list[ipaddress.IPv4Network] = []
    with IPRoute() as ipr:
        for msg in ipr.get_addr(family=2):
            used.append(ipaddress.ip_interface(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}").network)
        for msg in ipr.get_routes(family=2, table=254):
            dst = msg.get("RTA_DST")
            if dst:
                used.append(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False))
    return used


def free_subnet(prefixlen: int = 24, *, exclude: Iterable[str] = ()) -> ipaddress.IPv4Network:
    """A random subnet of the test ranges that no host address or route overlaps right now."""
    used = _used_ipv4_networks() + [ipaddress.ip_network(x) for x in exclude]
    candidates = [n for sup in TEST_SUPERNETS for n in sup.subnets(new_prefix=prefixlen)]
    random.shuffle(candidates)
    for net in candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetTestError(f"no free /{prefixlen} left in the test ranges")
