"""What the host-local IPAM plugin holds: one reservation per file in its dataDir."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

#: Files host-local keeps in its per-network directory that are not reservations.
HOST_LOCAL_BOOKKEEPING = ("lock", "last_reserved_ip.*")


@dataclass(frozen=True)
class Reservation:
    network: str
    ip: str
    container_id: str
    ifname: str


def host_local_reservations(data_dir: str | os.PathLike) -> list[Reservation]:
    """The addresses host-local holds under `data_dir` (its ``dataDir``), one per file.

    host-local names each file after the address and writes "<containerID>\\r\\n<ifname>" in it.
    """
    out: list[Reservation] = []
    root = Path(data_dir)
    if not root.is_dir():
        return out
    for netdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(netdir.iterdir()):
            try:
                ipaddress.ip_address(f.name)
            except ValueError:
                continue
            try:
                lines = f.read_text().splitlines()
            except FileNotFoundError:  # released while we looked (a DEL running now)
                continue
            out.append(
                Reservation(
                    netdir.name,
                    f.name,
                    lines[0].strip() if lines else "",
                    lines[1].strip() if len(lines) > 1 else "",
                )
            )
    return out
