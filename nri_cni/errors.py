"""The error hierarchy of nri-cni.

Every error nri-cni raises on purpose is a NriCniError. Each class knows the CNI error code it
is reported with (to the shim's caller, in the CNI error JSON) and the gRPC status code it is
reported with (to the runtime, in a ttrpc Response). Code that catches errors to report them
never needs to know which module raised them.
"""

from __future__ import annotations

from dataclasses import dataclass


class GrpcCode:
    """google.rpc.Code values, as ttrpc carries them in Response.status.code."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class CniCode:
    """CNI error codes (SPEC.md, "Error"), plus the ones nri-cni defines (>= 100 are ours)."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODING_FAILURE = 6
    INVALID_CONFIG = 7
    INVALID_NETNS = 8  # libcni's ErrInvalidNetNS, not in the spec table
    TRY_AGAIN_LATER = 11
    PLUGIN_NOT_AVAILABLE = 50  # STATUS
    PLUGIN_NOT_AVAILABLE_PODS_DEGRADED = 51  # STATUS
    INTERNAL = 999  # libcni's ErrInternal


class NriCniError(Exception):
    """Base of every error nri-cni raises on purpose."""

    cni_code: int = CniCode.INTERNAL
    grpc_code: int = GrpcCode.UNKNOWN

    def __init__(
        self, msg: str, *, details: str = "", cni_code: int | None = None, grpc_code: int | None = None
    ) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details
        if cni_code is not None:
            self.cni_code = cni_code
        if grpc_code is not None:
            self.grpc_code = grpc_code

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg

    def to_cni_error(self, cni_version: str = "1.1.0") -> dict:
        """The CNI error object (SPEC.md "Error") a plugin prints for this error."""
        out = {"cniVersion": cni_version, "code": self.cni_code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


class ConfigError(NriCniError):
    """A configuration (nri-cni's YAML, a conflist, a pod annotation) is invalid.

    `location` names where: a file path, optionally with a key path or line.
    """

    cni_code = CniCode.INVALID_CONFIG
    grpc_code = GrpcCode.INVALID_ARGUMENT

    def __init__(self, msg: str, *, location: str = "", details: str = "") -> None:
        super().__init__(msg, details=details)
        self.location = location

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.location}: {base}" if self.location else base


class ProtocolError(NriCniError):
    """The peer broke the wire protocol (ttrpc framing, NRI mux, shim socket)."""

    grpc_code = GrpcCode.INTERNAL


class RPCError(NriCniError):
    """A remote call answered with a non-OK status (or could not be made)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg, grpc_code=code)
        self.code = code

    def __str__(self) -> str:
        return f"rpc error: code = {self.code} desc = {self.msg}"


class Unavailable(NriCniError):
    """The other side (runtime, daemon) is not there or went away."""

    grpc_code = GrpcCode.UNAVAILABLE
    cni_code = CniCode.TRY_AGAIN_LATER


@dataclass(frozen=True)
class PluginRef:
    """Which plugin of which network an error came from, for messages and metrics."""

    network: str = ""
    plugin: str = ""
    command: str = ""

    def __str__(self) -> str:
        parts = []
        if self.network:
            parts.append(f"network {self.network!r}")
        if self.plugin:
            parts.append(f"plugin {self.plugin!r}")
        if self.command:
            parts.append(self.command)
        return ", ".join(parts)


class CNIError(NriCniError):
    """A CNI plugin reported an error (its stdout held a CNI error object)."""

    grpc_code = GrpcCode.UNKNOWN

    def __init__(self, code: int, msg: str, *, details: str = "", ref: PluginRef | None = None) -> None:
        super().__init__(msg, details=details, cni_code=code)
        self.code = code
        self.ref = ref or PluginRef()

    def __str__(self) -> str:
        where = f"{self.ref}: " if str(self.ref) else ""
        return f"{where}{super().__str__()} (CNI code {self.code})"


class PluginExecError(CNIError):
    """A plugin could not be run or misbehaved: missing binary, timeout, garbage output, crash."""

    def __init__(
        self, msg: str, *, details: str = "", ref: PluginRef | None = None, code: int = CniCode.INTERNAL
    ) -> None:
        super().__init__(code, msg, details=details, ref=ref)


class PluginTimeout(PluginExecError):
    grpc_code = GrpcCode.DEADLINE_EXCEEDED


class PodError(NriCniError):
    """A pod-level operation failed; wraps the first cause and names the network."""

    def __init__(self, msg: str, *, cause: NriCniError | None = None, network: str = "") -> None:
        super().__init__(
            msg,
            details=str(cause) if cause else "",
            cni_code=cause.cni_code if cause else None,
            grpc_code=cause.grpc_code if cause else None,
        )
        self.cause = cause
        self.network = network


class AnnotationRefused(ConfigError):
    """A pod annotation (untrusted, written by users) asked for something not allowed."""

    grpc_code = GrpcCode.PERMISSION_DENIED
