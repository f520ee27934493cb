"""The README's first run as root meets it: up.sh, run under the system PATH only with
stand-ins for the slow parts, announces every step with its time and hands the runtime to
node.py; node.py under Debian's python3 re-runs itself in the checkout's virtualenv."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.integration  # up.sh refuses to run as any user but root
def test_up_sh_says_what_it_does_with_times(tmp_path):
    """up.sh under the system PATH only, with stand-ins for the slow parts: every step is
    announced with its time, in order, and it ends with the node script."""
    executable(tmp_path / "config/local/up.sh", (ROOT / "config/local/up.sh").read_text())
    executable(tmp_path / ".ci/install-deps", "echo install-deps ran\n")
    executable(tmp_path / ".ci/venv", f'echo venv "$1" >&2; echo {tmp_path}/.venv\n')
    executable(
        tmp_path / ".venv/bin/python",
        '#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.x"; exit 0; }\n'
        'echo "node: $* start=$NRI_CNI_UP_START"\n',
    )
    out = subprocess.run(
        ["bash", "config/local/up.sh"],
        cwd=tmp_path,
        env={"PATH": SYSTEM_PATH, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    steps = [line for line in lines if re.match(r"up: \[\s*\d+s\] ", line)]
    assert [s.split("] ", 1)[1].split(" ")[0] for s in steps] == [
        "installing",
        "creating",
        "virtualenv",
        "starting",
        "done",
    ]
    assert "install-deps ran" in lines
    assert any(line.startswith("node: config/local/node.py up start=") for line in lines)


@pytest.mark.integration  # up.sh refuses to run as any user but root
def test_up_sh_takes_the_runtime(tmp_path):
    """`up.sh --runtime crio` hands the runtime to node.py; anything else is a usage error."""
    executable(tmp_path / "config/local/up.sh", (ROOT / "config/local/up.sh").read_text())
    executable(tmp_path / ".ci/install-deps", "true\n")
    executable(tmp_path / ".ci/venv", f"echo {tmp_path}/.venv\n")
    executable(tmp_path / ".venv/bin/python", '#!/bin/sh\necho "node: $*"\n')
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path)}
    run = [["bash", "config/local/up.sh", *args] for args in (["--runtime", "crio"], ["--runtime", "docker"])]
    ok, bad = (subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True) for cmd in run)
    assert ok.returncode == 0 and "node: config/local/node.py up --runtime crio" in ok.stdout, ok.stderr
    assert bad.returncode == 2 and "usage: up.sh [--runtime containerd|crio]" in bad.stderr


@pytest.mark.integration  # needs the checkout's own .venv (made by .ci/run as root)
def test_node_py_under_the_system_python_uses_the_venv():
    """`python3 config/local/node.py` (Debian's python3, no grpc) re-runs itself in .venv."""
    python3 = shutil.which("python3", path=SYSTEM_PATH)
    has_grpc = subprocess.run([python3, "-c", "import grpc"], capture_output=True).returncode == 0
    out = subprocess.run(
        [python3, str(ROOT / "config/local/node.py")],
        env={"PATH": SYSTEM_PATH},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2  # the usage text, from whichever python has grpc
    assert "node.py up" in out.stderr
    assert has_grpc or (ROOT / ".venv/bin/python").exists()
