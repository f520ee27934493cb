"""What the ttrpc client and server need from the byte pipe under them.

They are asyncio Protocols: whatever carries their bytes calls connection_made(transport),
data_received(bytes) for every chunk that arrives, and connection_lost(exc) at the end. The
transport they write to needs only the two methods below. An asyncio socket transport has them;
so does a logical connection of the NRI multiplexer (nri_cni.nri.trunk), which is why the same
client and server run over a plain unix socket and over NRI.
"""

from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    def write(self, data: bytes) -> None:
        """Queue bytes for the peer; never blocks."""

    def close(self) -> None:
        """End the connection; the protocol's connection_lost follows."""
