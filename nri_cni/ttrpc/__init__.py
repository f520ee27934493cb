"""ttrpc, containerd's small RPC protocol: framing, connection state machine, client, server.

framing and connection are pure (bytes in, events and bytes out); client and server put them
on asyncio over any byte pipe (transport.Transport).
"""

from nri_cni.ttrpc.client import TtrpcClient
from nri_cni.ttrpc.errors import TtrpcProtocolError
from nri_cni.ttrpc.server import (
    Handler,
    RequestDeadline,
    ServerConnection,
    Services,
    TtrpcServer,
    request_deadline,
)

__all__ = [
    "Handler",
    "RequestDeadline",
    "ServerConnection",
    "Services",
    "TtrpcClient",
    "TtrpcProtocolError",
    "TtrpcServer",
    "request_deadline",
]
