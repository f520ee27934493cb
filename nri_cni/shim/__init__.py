"""`nri-cni-shim`: the CNI plugin a runtime runs for its only network in shim mode.

The shim's program is `program.py`, written out by `nri-cni install-shim` as a standalone script
(with the interpreter's absolute path and `-I -S`: no site, no pyenv shim, no package imports), so
that each CNI call costs about a bare interpreter start.
"""
from __future__ import annotations

import os
import sys
from importlib import resources

from nri_cni.config import DEFAULT_DAEMON_SOCKET

SHIM_NAME = "nri-cni-shim"


def render(socket_path: str = DEFAULT_DAEMON_SOCKET, python: str | None = None) -> str:
    """The shim script's text, bound to an interpreter and a default daemon socket."""
    source = resources.files(__package__).joinpath("program.py").read_text()
    python = python or os.path.realpath(sys.executable)
    body = source.replace("@DEFAULT_SOCKET@", socket_path)
    return f"#!{python} -IS\n" + body


def install(dest_dir: str, socket_path: str = DEFAULT_DAEMON_SOCKET, python: str | None = None) -> str:
    """Writes the shim into a CNI bin dir atomically (a running runtime may exec it meanwhile)."""
    os.makedirs(dest_dir, exist_ok=True)
    path = os.path.join(dest_dir, SHIM_NAME)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(render(socket_path, python))
    os.chmod(tmp, 0o755)
    os.rename(tmp, path)
    return path
