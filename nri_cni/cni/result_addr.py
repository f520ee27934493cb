"""Addresses in CNI results: validated and written in canonical form (as libcni's Go types
re-marshal them), and their family."""

from __future__ import annotations

import functools
import ipaddress
import socket

from nri_cni.errors import CniCode, CNIError


def bad_result(msg: str) -> CNIError:
    return CNIError(CniCode.DECODING_FAILURE, f"invalid CNI result: {msg}")


@functools.lru_cache(maxsize=4096)
def canonical(text: str, with_prefix: bool) -> tuple[str, int] | None:
    """(canonical text, IP version), or None if invalid. Cached: a chain repeats the same
    addresses in every prevResult. Plain addresses go through the C parser (inet_pton /
    inet_ntop, the same canonical form); the rest (zones, IPv4-mapped IPv6, a prefix
    written with a leading zero) through ipaddress."""
    addr, slash, plen = text.partition("/")
    if bool(slash) != with_prefix:
        return None
    v6 = ":" in addr
    if "%" not in addr and "." not in (addr if v6 else ""):
        family = socket.AF_INET6 if v6 else socket.AF_INET
        try:
            canon = socket.inet_ntop(family, socket.inet_pton(family, addr))
        except (OSError, ValueError):  # ValueError: NUL
            return None
        if not v6 or "." not in canon:  # inet_ntop writes ::ffff:a.b.c.d, ipaddress does not
            if not slash:
                return canon, 6 if v6 else 4
            if plen.isascii() and plen.isdigit() and (plen == "0" or plen[0] != "0"):
                return (f"{canon}/{plen}", 6 if v6 else 4) if int(plen) <= (128 if v6 else 32) else None
    return canonical_slow(text, with_prefix)


def canonical_slow(text: str, with_prefix: bool) -> tuple[str, int] | None:
    try:
        addr = ipaddress.ip_interface(text) if with_prefix else ipaddress.ip_address(text)
    except ValueError:
        return None
    return str(addr), addr.version


def ip_family(cidr: str) -> int:
    canon = canonical(cidr, True)
    if canon is None:  # a hand-built Result
        raise bad_result(f"{cidr!r} is not an address/prefix")
    return canon[1]
