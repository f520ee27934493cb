"""The host side's edges: what an attachment needs on the host besides links (portmap's DNAT
for its hostPorts, its plugin's masquerade of its addresses, host-local's leases), and what one
round read of it (hostside.py reads, model.py compares)."""

from __future__ import annotations

from dataclasses import dataclass, field

NFT_MASQ = "nftables-masq"  # the one table the plugins' nftables masquerade keeps, both families


@dataclass(frozen=True)
class HostPort:
    """A hostPort portmap must DNAT: IP family (4 or 6), protocol, port, portmap's backend."""

    family: int
    proto: str
    port: int
    backend: str = "iptables"  # or "nftables"

    @property
    def table(self) -> str:
        """Where its rules are read (hostside.py): "iptables4", "nftables6"..."""
        return f"{self.backend}{self.family}"


@dataclass(frozen=True)
class Masq:
    """An address of the pod its plugin masquerades (bridge or ptp with `ipMasq: true`).

    owner: what its rules name: for iptables the container id in their comment (the chain's name
    is a hash of network and container id), for nftables the hash of network, ifname and
    container id that opens the rule's comment (the rest of which may be cut at 128 bytes)."""

    family: int
    ip: str  # as Python's ipaddress writes it
    backend: str  # "iptables" or "nftables"
    owner: str

    @property
    def table(self) -> str:
        """Where its rules are read: "iptables4" / "iptables6" (the same `iptables-save -t nat`
        that portmap's DNAT rules are read from), or NFT_MASQ."""
        return f"iptables{self.family}" if self.backend == "iptables" else NFT_MASQ


@dataclass(frozen=True)
class Lease:
    """A host-local lease: the file naming the address, which must hold the container's id."""

    path: str
    ip: str


@dataclass
class HostSide:
    """The host-side state of a round, read once for every pod: portmap's DNAT rules per
    backend and IP family (HostPort.table -> container id -> {(proto, port)}), the masqueraded
    addresses (Masq.table -> owner -> {ip}), and host-local's lease files (path -> the container
    id it names). What could not be read is in `errors`."""

    dnat: dict[str, dict[str, set[tuple[str, int]]]] = field(default_factory=dict)
    masq: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    leases: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # a table or a lease path -> why
