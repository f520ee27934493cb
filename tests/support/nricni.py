"""`nri-cni run` as a real process next to a test containerd, and the shim-mode CNI setup.

The shim-mode CNI list is config/containerd/net.d/10-nri-cni.conflist itself, with only its
daemon socket path pointed at the test's daemon (the shipped file, not a copy).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from nri_cni.local import proto as localproto
from nri_cni.shim import install
from tests.support.bin_dir import install_test_plugin, link_real_plugins
from tests.support.daemon_config import daemon_config

REPO = Path(__file__).resolve().parents[2]
SHIM_CONFLIST = REPO / "config" / "containerd" / "net.d" / "10-nri-cni.conflist"


class NriCni:
    """One daemon process with a private config, state, cache and sockets."""

    def __init__(self, tmp: Path, cfg: dict) -> None:
        self.tmp = tmp
        self.cfg = cfg
        self.config_path = tmp / "nri-cni.yaml"
        self.log_path = tmp / "nri-cni.log"
        self.socket = cfg["daemon"]["socket"]
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ)

    def start(self, *, wait_registered: bool = True, env: dict | None = None) -> NriCni:
        self.config_path.write_text(yaml.safe_dump(self.cfg))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nri_cni.cli", "run", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **(env or {})},
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nri-cni exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                st = self.status()
                if not wait_registered or st["nri"]["synchronized"]:
                    return self
            except (OSError, localproto.LocalProtocolError, Exception):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"nri-cni did not become ready:\n{self.log_tail()}")

    def ask(self, op: str):
        status, payload = localproto.call(self.socket, {localproto.OP_KEY: op}, timeout=60)
        data = json.loads(payload)
        if status:
            raise RuntimeError(data)
        return data

    def status(self) -> dict:
        return self.ask("status")

    def pods(self) -> list[dict]:
        return self.ask("pods")

    def wait_idle(self, timeout: float = 60) -> None:
        """Until the background work after a (re)synchronization is done (GC, repair): the
        task it started has ended (status counts it from the Synchronize on); the timeout
        only fails a hang."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st["nri"]["synchronized"] and st["tracked"]["background"] == 0 and not st["pendingRepair"]:
                return
            time.sleep(0.05)
        raise RuntimeError("nri-cni did not settle")

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def op_lines(self) -> list[dict]:
        """The structured pod operation lines from the log."""
        out = []
        # the daemon may be writing a line right now: only the complete ones
        for line in self.log_path.read_text().split("\n")[:-1]:
            if "nri_cni.podop: " in line:
                out.append(json.loads(line.split("nri_cni.podop: ", 1)[1]))
        return out

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text().splitlines()[-n:])


class ShimSetup:
    """Dirs for a shim-mode node: CNI bin dir (shim + real plugins + fakes), the runtime's conf
    dir holding the shipped shim list, nri-cni's state and cache, a short socket dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock_dir = Path(tempfile.mkdtemp(prefix="nct-"))  # unix socket paths are short
        self.socket = str(self.sock_dir / "d.sock")
        self.bin_dir = tmp / "bin"
        self.bin_dir.mkdir()
        link_real_plugins(self.bin_dir)
        install(str(self.bin_dir), self.socket)
        install_test_plugin(self.bin_dir, "fake_plugin", "fake-finalize", "fake-fail")
        self.conf_dir = tmp / "net.d"
        self.conf_dir.mkdir()
        shim_list = json.loads(SHIM_CONFLIST.read_text())
        for plugin in shim_list["plugins"]:
            if plugin["type"] == "nri-cni-shim":
                plugin["daemonSocket"] = self.socket
        (self.conf_dir / SHIM_CONFLIST.name).write_text(json.dumps(shim_list))
        self.cache_dir = tmp / "cache"
        self.state_dir = tmp / "state"
        self.ipam_dir = tmp / "ipam"
        self.finalize_dir = tmp / "nri-net.d" / "_finalize.d"
        self.finalize_dir.mkdir(parents=True)

    def config(self, nri_socket: str, networks: list[dict], mode: str = "shim", **extra) -> dict:
        extra.setdefault("log", {"level": "info"})
        return daemon_config(
            mode,
            networks,
            nri_socket=nri_socket,
            daemon_socket=self.socket,
            state_dir=self.state_dir,
            bin_dirs=[self.bin_dir],
            cache_dir=self.cache_dir,
            finalize_dir=self.finalize_dir,
            plugin_timeout="30s",
            **extra,
        )

    def cleanup(self) -> None:
        shutil.rmtree(self.sock_dir, ignore_errors=True)
