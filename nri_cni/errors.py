"""The error hierarchy of nri-cni, and how each error is reported.

Every error nri-cni raises on purpose is a NriCniError with a `kind` (Kind). One table, WIRE,
maps each kind to the CNI error code it is reported with (to the shim's caller, in the CNI
error JSON), the gRPC status it is reported with (to the runtime, in a ttrpc Response) and the
exit code of the `nri-cni` command. Decisions (doomed delete, metrics, exit codes) read the
kind or the code, never the message. A code that comes from outside is kept per error: the CNI
code a plugin printed, the status a remote call answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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


# Exit codes of the `nri-cni` command (distinct, as node tooling expects).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_PLUGIN = 4
EXIT_INTERRUPTED = 130


class Kind(Enum):
    """What went wrong, as far as a decision needs to know."""

    FAILED = "failed"  # an operation failed; nothing more specific to say
    CONFIG = "config"  # a configuration (nri-cni's YAML, a conflist) is invalid
    REFUSED = "refused"  # a pod annotation asked for what is not allowed
    BAD_ENV = "bad-env"  # a CNI call's environment is incomplete or wrong
    UNDECODABLE = "undecodable"  # a CNI call's stdin is not a JSON object
    IO = "io"  # nri-cni's own state could not be written
    UNAVAILABLE = "unavailable"  # the other side (runtime, daemon) is not there
    PROTOCOL = "protocol"  # the peer broke the wire protocol
    REMOTE = "remote"  # a remote call answered with an error status (kept per error)
    PLUGIN_NOT_RUN = "plugin-not-run"  # not found, bad name, could not exec: it created nothing
    PLUGIN_ERROR = "plugin-error"  # printed a CNI error: its own code is kept
    PLUGIN_BROKEN = "plugin-broken"  # crashed or printed garbage: it may have done anything
    PLUGIN_TIMEOUT = "plugin-timeout"  # killed at its deadline: it may have done anything


@dataclass(frozen=True)
class Wire:
    """How one kind of error is reported on each channel."""

    cni: int  # CNI error code (shim, CNI error JSON)
    grpc: int  # gRPC status (ttrpc answer to the runtime)
    exit: int  # exit code of the nri-cni command


WIRE: dict[Kind, Wire] = {
    Kind.FAILED: Wire(CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_FAILED),
    Kind.CONFIG: Wire(CniCode.INVALID_CONFIG, GrpcCode.INVALID_ARGUMENT, EXIT_USAGE),
    Kind.REFUSED: Wire(CniCode.INVALID_CONFIG, GrpcCode.PERMISSION_DENIED, EXIT_USAGE),
    Kind.BAD_ENV: Wire(CniCode.INVALID_ENV, GrpcCode.INVALID_ARGUMENT, EXIT_USAGE),
    Kind.UNDECODABLE: Wire(CniCode.DECODING_FAILURE, GrpcCode.INVALID_ARGUMENT, EXIT_USAGE),
    Kind.IO: Wire(CniCode.IO_FAILURE, GrpcCode.UNKNOWN, EXIT_FAILED),
    Kind.UNAVAILABLE: Wire(CniCode.TRY_AGAIN_LATER, GrpcCode.UNAVAILABLE, EXIT_UNAVAILABLE),
    Kind.PROTOCOL: Wire(CniCode.INTERNAL, GrpcCode.INTERNAL, EXIT_FAILED),
    Kind.REMOTE: Wire(CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_FAILED),
    Kind.PLUGIN_NOT_RUN: Wire(CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_PLUGIN),
    Kind.PLUGIN_ERROR: Wire(CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_PLUGIN),
    Kind.PLUGIN_BROKEN: Wire(CniCode.INTERNAL, GrpcCode.UNKNOWN, EXIT_PLUGIN),
    Kind.PLUGIN_TIMEOUT: Wire(CniCode.INTERNAL, GrpcCode.DEADLINE_EXCEEDED, EXIT_PLUGIN),
}


def exit_code_for(exc: BaseException) -> int:
    """The `nri-cni` command's exit code for an error that ended it."""
    return WIRE[exc.kind].exit if isinstance(exc, NriCniError) else EXIT_FAILED


class NriCniError(Exception):
    """Base of every error nri-cni raises on purpose. `kind` says what it is; the codes it is
    reported with come from WIRE unless given (a code from outside: a plugin's, a peer's)."""

    kind: Kind = Kind.FAILED

    def __init__(
        self,
        msg: str,
        *,
        details: str = "",
        kind: Kind | None = None,
        cni_code: int | None = None,
        grpc_code: int | None = None,
    ) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details
        if kind is not None:
            self.kind = kind
        wire = WIRE[self.kind]
        self.cni_code: int = wire.cni if cni_code is None else cni_code
        self.grpc_code: int = wire.grpc if grpc_code is None else grpc_code

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg

    def to_cni_error(self, cni_version: str = "1.1.0") -> dict[str, object]:
        """The CNI error object (SPEC.md "Error") a plugin prints for this error."""
        out: dict[str, object] = {"cniVersion": cni_version, "code": self.cni_code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


class ConfigError(NriCniError):
    """A configuration (nri-cni's YAML, a conflist, a pod annotation) is invalid.

    `location` names where: a file path, optionally with a key path or line.
    """

    kind = Kind.CONFIG

    def __init__(self, msg: str, *, location: str = "", details: str = "") -> None:
        super().__init__(msg, details=details)
        self.location = location

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.location}: {base}" if self.location else base


class ProtocolError(NriCniError):
    """The peer broke the wire protocol (ttrpc framing, NRI mux, shim socket)."""

    kind = Kind.PROTOCOL


class RPCError(NriCniError):
    """A remote call answered with a non-OK status (or could not be made)."""

    kind = Kind.REMOTE

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg, grpc_code=code)
        self.code = code

    def __str__(self) -> str:
        return f"rpc error: code = {self.code} desc = {self.msg}"


class Unavailable(NriCniError):
    """The other side (runtime, daemon) is not there or went away."""

    kind = Kind.UNAVAILABLE


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


NO_PLUGIN = PluginRef()  # an error no plugin is named in (yet: the runtime sets it when it knows)


class CNIError(NriCniError):
    """A CNI error object: a plugin printed it (its code kept), or nri-cni's CNI runtime made
    one (cache, result decoding)."""

    kind = Kind.PLUGIN_ERROR

    def __init__(self, code: int, msg: str, *, details: str = "", ref: PluginRef = NO_PLUGIN) -> None:
        super().__init__(msg, details=details, cni_code=code)
        self.code = code
        self.ref = ref
        # the failed plugin's position in its chain (the CNI runtime sets it; None: no plugin
        # started, e.g. a binary not found before the chain ran)
        self.plugin_index: int | None = None

    def __str__(self) -> str:
        where = f"{self.ref}: " if str(self.ref) else ""
        return f"{where}{super().__str__()} (CNI code {self.code})"


class PluginExecError(CNIError):
    """A plugin ran and misbehaved: crash, garbage or unusable output; it may have done anything."""

    kind = Kind.PLUGIN_BROKEN

    def __init__(
        self, msg: str, *, details: str = "", ref: PluginRef = NO_PLUGIN, code: int = CniCode.INTERNAL
    ) -> None:
        super().__init__(code, msg, details=details, ref=ref)


class PluginNotRun(PluginExecError):
    """A plugin could not be run at all (not found, invalid name, exec failed): it created nothing."""

    kind = Kind.PLUGIN_NOT_RUN


class PluginTimeout(PluginExecError):
    """A plugin was killed at its deadline."""

    kind = Kind.PLUGIN_TIMEOUT


class PodError(NriCniError):
    """A pod-level operation failed; wraps the first cause (its kind and codes) and names the
    network."""

    def __init__(self, msg: str, *, cause: NriCniError | None = None, network: str = "") -> None:
        super().__init__(
            msg,
            details=str(cause) if cause else "",
            kind=cause.kind if cause else None,
            cni_code=cause.cni_code if cause else None,
            grpc_code=cause.grpc_code if cause else None,
        )
        self.cause = cause
        self.network = network


class AnnotationRefused(ConfigError):
    """A pod annotation (untrusted, written by users) asked for something not allowed."""

    kind = Kind.REFUSED
