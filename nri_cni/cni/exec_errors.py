"""What a plugin call comes to, from what the plugin did (`Ended`): its stdout on success, or
the error its exit, timeout or overflow is classified as, a CNI error object it printed passed
on. One function for every Executor (exec.py's processes, executor.py's in-process fakes)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nri_cni.cni import plugin_process
from nri_cni.cni.plugin_process import STDERR_TAIL
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginRef, PluginTimeout
from nri_cni.safety import jsonlimits


class PluginOutput(bytes):
    """A plugin's stdout, with the tail of its stderr for messages about bad output."""

    stderr: bytes = b""


@dataclass(frozen=True)
class Ended:
    """How one plugin call ended."""

    stdout: bytes = b""
    stderr: bytes = b""
    status: int | None = 0  # exit code, or -signal; None: not seen (given up on)
    timed_out: bool = False  # killed at the timeout
    overflow: bool = False  # killed for printing more than MAX_STDOUT


def outcome(ended: Ended, plugin_path: str, ref: PluginRef, timeout: float) -> PluginOutput:
    """The plugin's stdout when it exited 0 in time (possibly empty); else raises CNIError
    when it printed a CNI error object and failed, PluginTimeout when it was killed at the
    timeout, PluginExecError for anything else."""
    stdout = ended.stdout
    stderr = ended.stderr[-STDERR_TAIL:]
    name = os.path.basename(plugin_path)
    if ended.timed_out:
        raise PluginTimeout(
            f"plugin {name} killed after {timeout:g}s timeout", details=excerpt(stdout, stderr), ref=ref
        )
    if ended.overflow:
        raise PluginExecError(f"plugin {name} printed more than {plugin_process.MAX_STDOUT} bytes", ref=ref)
    if ended.status == 0:
        out = PluginOutput(stdout)
        out.stderr = stderr
        return out
    how = (
        f"killed by signal {-ended.status}"
        if ended.status is not None and ended.status < 0
        else f"exit status {ended.status}"
    )
    if not stdout.strip():
        raise PluginExecError(
            f"plugin {name} failed ({how}) with no output", details=excerpt(b"", stderr), ref=ref
        )
    try:
        obj = jsonlimits.loads(stdout)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("code"), int) and not isinstance(obj["code"], bool):
        details = obj.get("details")
        raise CNIError(
            obj["code"], str(obj.get("msg", "")), details=details if isinstance(details, str) else "", ref=ref
        )
    raise PluginExecError(
        f"plugin {name} failed ({how}) and its output is not a CNI error",
        details=excerpt(stdout, stderr),
        ref=ref,
        code=CniCode.DECODING_FAILURE,
    )


def excerpt(stdout: bytes, stderr: bytes) -> str:
    """The first ~200 bytes the plugin printed and the tail of its stderr, for messages."""
    parts = []
    if stdout:
        head = stdout[:200].decode(errors="replace")
        parts.append(f"stdout {head!r}{'...' if len(stdout) > 200 else ''}")
    if stderr:
        parts.append(f"stderr {stderr.decode(errors='replace').strip()!r}")
    return "; ".join(parts)
