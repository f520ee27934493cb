"""What the CNI runtime's verbs take and raise: an attachment's runtime config, the observer of
plugin calls, and GC's collected error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from nri_cni.errors import CNIError, NriCniError, PluginRef


@dataclass
class RuntimeConf:
    container_id: str
    netns: str
    ifname: str
    args: list[tuple[str, str]] = field(default_factory=list)  # CNI_ARGS pairs (K8S_POD_NAME, ...)
    capability_args: dict[str, Any] = field(
        default_factory=dict[str, Any]
    )  # runtimeConfig, filtered per plugin
    # Addresses ADD asks the IPAM for (a repair keeping a pod's IPs), with prefix lengths. ADD
    # only: never cached, never in an intent record, so no DEL, CHECK or FINALIZE carries it
    # (plugin_io.request_ips says how it reaches the plugins).
    ip_request: tuple[str, ...] = ()


@dataclass(frozen=True)
class PluginCall:
    """One plugin call that succeeded, as an operation's record keeps it."""

    network: str
    plugin: str  # its type
    command: str  # ADD, CHECK, DEL, FINALIZE
    ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "plugin": self.plugin, "command": self.command, "ms": self.ms}


class PluginObserver(Protocol):
    """Hears of each plugin call a verb made (the operation's record: per-plugin timings)."""

    def plugin_done(self, call: PluginCall) -> None: ...


@dataclass(frozen=True)
class Attachment:
    container_id: str
    ifname: str


class GCError(CNIError):
    """One or more steps of a GC failed (GC runs them all); `errors` holds each, the code is the
    first one's."""

    def __init__(self, network: str, errors: list[NriCniError]) -> None:
        first = errors[0]
        super().__init__(
            getattr(first, "code", first.cni_code),
            f"GC of network {network!r} failed in {len(errors)} step(s)",
            details="; ".join(str(e) for e in errors),
            ref=PluginRef(network=network),
        )
        self.errors = errors
