"""What a failed plugin call raises: its exit, timeout or overflow classified, a CNI error
object it printed passed on, and the excerpt of its output quoted in messages."""

from __future__ import annotations

import os
from typing import NoReturn

from nri_cni.cni import plugin_process
from nri_cni.cni.plugin_process import STDERR_TAIL, ChildRun
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginRef, PluginTimeout
from nri_cni.safety import jsonlimits


def failure(run: ChildRun, plugin_path: str, ref: PluginRef, timeout: float) -> NoReturn:
    stdout = b"".join(run.stdout)
    stderr = bytes(run.stderr[-STDERR_TAIL:])
    name = os.path.basename(plugin_path)
    if run.timed_out:
        raise PluginTimeout(
            f"plugin {name} killed after {timeout:g}s timeout", details=excerpt(stdout, stderr), ref=ref
        )
    if run.overflow:
        raise PluginExecError(f"plugin {name} printed more than {plugin_process.MAX_STDOUT} bytes", ref=ref)
    how = (
        f"killed by signal {-run.status}"
        if run.status is not None and run.status < 0
        else f"exit status {run.status}"
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
