"""`nri-cni-shim`: the CNI plugin a runtime runs for its only network in shim mode.

Two builds of one program, chosen by `nri-cni install-shim`:
- compiled from `shim.c` when a C compiler is at hand (the default): ~1 ms per CNI call;
- the standalone script `program.py` otherwise, written with the interpreter's absolute path and
  `-IS` (no site, no pyenv shim, no package imports): about a bare interpreter start, ~9 ms.
The runtime execs the shim for every ADD and DEL, so its start is on every pod's critical path.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import resources

from nri_cni.config import DEFAULT_DAEMON_SOCKET
from nri_cni.errors import ConfigError

SHIM_NAME = "nri-cni-shim"
# program.py's import of the codec, replaced by the codec's text when the script is rendered
_CODEC_IMPORT = re.compile(
    r"^from nri_cni\.local\.codec import \(  # @LOCAL_CODEC@\n(?:    .*\n)*?\)\n", re.M
)
log = logging.getLogger(__name__)


def render(socket_path: str = DEFAULT_DAEMON_SOCKET, python: str | None = None) -> str:
    """The shim script's text, bound to an interpreter and a default daemon socket."""
    source = resources.files(__package__).joinpath("program.py").read_text()
    python = python or os.path.realpath(sys.executable)
    # the local protocol's one Python implementation, inlined: the script imports nothing
    codec = resources.files("nri_cni.local").joinpath("codec.py").read_text()
    body = _CODEC_IMPORT.sub(lambda _: codec, source.replace("@DEFAULT_SOCKET@", socket_path), count=1)
    return f"#!{python} -IS\n" + body


def compile_shim(out: str, socket_path: str = DEFAULT_DAEMON_SOCKET, cc: str | None = None) -> None:
    """Builds shim.c into `out` (static where the C library allows it, so the binary can be
    copied onto any node of the same architecture)."""
    cc = cc or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ConfigError("no C compiler (cc) found to build nri-cni-shim")
    source = resources.files(__package__).joinpath("shim.c")
    with resources.as_file(source) as src:
        base = [cc, "-O2", "-Wall", f'-DDEFAULT_SOCKET="{socket_path}"', "-o", out, str(src)]
        for extra in (["-static"], []):
            proc = subprocess.run(base[:1] + extra + base[1:], capture_output=True, text=True)
            if proc.returncode == 0:
                return
    raise ConfigError("building nri-cni-shim failed", details=proc.stderr.strip()[-2000:])


def install(
    dest_dir: str,
    socket_path: str = DEFAULT_DAEMON_SOCKET,
    python: str | None = None,
    compiled: bool | None = None,
) -> str:
    """Writes the shim into a CNI bin dir atomically (a running runtime may exec it meanwhile).

    compiled: True = the C build or an error; False = the script; None = the C build when a
    compiler is found, else the script. Naming an interpreter (`python`) asks for the script.
    """
    if any(c in socket_path for c in '"\\\n'):
        raise ConfigError(f"daemon socket path {socket_path!r} has a quote, backslash or newline")
    os.makedirs(dest_dir, exist_ok=True)
    path = os.path.join(dest_dir, SHIM_NAME)
    fd, tmp = tempfile.mkstemp(prefix=f".{SHIM_NAME}.", dir=dest_dir)
    os.close(fd)
    try:
        want_c = compiled if compiled is not None else (python is None and _have_cc())
        if want_c:
            compile_shim(tmp, socket_path)
        else:
            with open(tmp, "w") as f:
                f.write(render(socket_path, python))
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _have_cc() -> bool:
    return bool(shutil.which("cc") or shutil.which("gcc"))
