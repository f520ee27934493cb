"""config/local/node.py's messages: a usage error for an unknown runtime, one line (no
traceback) naming the daemon's log when the daemon crashed, one line for a runtime's error."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_node():
    spec = importlib.util.spec_from_file_location("local_node", ROOT / "config" / "local" / "node.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """Processes whose command line looks like containerd's or nri-cni's (what pid_of checks).
    A stand-in is handed out once it runs its own code: Popen returns as soon as the exec began,
    and until the kernel has laid out the new program's arguments its /proc cmdline is empty."""
    procs = []

    def start(*marker: str) -> subprocess.Popen:
        code = "import os, time; os.write(1, b'up'); os.close(1); time.sleep(60)"
        proc = subprocess.Popen([sys.executable, "-c", code, *marker], stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout.read() == b"up"  # its own words, then EOF: it runs its own code
        proc.stdout.close()
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
