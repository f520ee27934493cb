"""The README's first run: up.sh and node.py as a new admin meets them (issue #13)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def load_node():
    spec = importlib.util.spec_from_file_location("local_node", ROOT / "config" / "local" / "node.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_readme_commands_need_no_sudo():
    """A root shell on a node often has no sudo: the two commands run as they are written."""
    assert readme_commands() == ["bash config/local/up.sh", "bash .ci/run"]
    assert "sudo " not in (ROOT / "README.md").read_text()


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


def test_node_py_up_takes_the_runtime(capsys):
    node = load_node()
    assert node.main(["up", "--runtime", "docker"]) == 2
    assert "usage: node.py up [--runtime containerd|crio]" in capsys.readouterr().err


@pytest.fixture
def node(tmp_path, monkeypatch):
    module = load_node()
    monkeypatch.setattr(module, "STATE", tmp_path / "state")
    monkeypatch.setattr(module, "RUN", tmp_path / "run")
    monkeypatch.setattr(module, "ADDRESS", tmp_path / "run" / "containerd.sock")
    (tmp_path / "state").mkdir()
    (tmp_path / "run").mkdir()
    return module


@pytest.fixture
def stand_in():
    """Processes whose command line looks like containerd's or nri-cni's (what pid_of checks)."""
    procs = []

    def start(*marker: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *marker])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("how", ["exited", "zombie"])
def test_pod_after_a_daemon_crash_says_so_without_a_traceback(node, capsys, stand_in, how):
    (node.RUN / "containerd.pid").write_text(str(stand_in("containerd").pid))
    daemon = stand_in("nri_cni.cli", "run")
    daemon.kill()  # a crash: not reaped yet, it lingers as a zombie under its pid
    if how == "exited":
        daemon.wait()
    else:
        while Path(f"/proc/{daemon.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)
    (node.RUN / "nri-cni.pid").write_text(str(daemon.pid))
    (node.STATE / "nri-cni.log").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert node.main(["pod", "demo-1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err.replace("log", "")
    assert len(err.strip().splitlines()) == 1
    assert "nri-cni is not running" in err and "RuntimeError: boom" in err
    assert str(node.STATE / "nri-cni.log") in err


def test_a_runtime_error_is_one_line(node, capsys, monkeypatch, stand_in):
    """Both run, but the pod fails (the shim cannot reach a daemon that just died)."""
    (node.RUN / "containerd.pid").write_text(str(stand_in("containerd").pid))
    (node.RUN / "nri-cni.pid").write_text(str(stand_in("nri_cni.cli", "run").pid))

    class Failed(grpc.RpcError):
        def details(self):
            return "failed to setup network for sandbox: plugin type=nri-cni-shim failed (add):\nunreachable"

    class Client:
        def run_pod(self, *args):
            raise Failed()

    monkeypatch.setattr(node, "cri", Client)
    assert node.main(["pod", "demo-1"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "node.py pod: failed to setup network for sandbox: plugin type=nri-cni-shim failed (add): unreachable"
    )


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
