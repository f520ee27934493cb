"""What the tests' private containerd and CRI-O share: one runtime process started in a
session of its own with its output in a log, ready when its CRI answers, stopped (SIGTERM) or
killed (SIGKILL) by its PID. The subclass gives ``name``, ``error``, ``log_path``, ``address``,
``start_timeout`` and a ``cri`` client kept in ``_cri``."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


class RuntimeProcess:
    name = "runtime"
    error: type[Exception] = RuntimeError
    log_path: Path
    address: str
    start_timeout: float
    proc: subprocess.Popen[bytes] | None
    _cri: Any

    @property
    def cri(self) -> Any:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running else None  # type: ignore[union-attr]

    def _spawn(self, argv: list[str], env: dict[str, str]) -> float:
        """Starts the process (its output appended to the log); returns when it started."""
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"---- nri-cni test: starting {self.name} ({time.ctime()})\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )
        return t0

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise self.error(
                    f"{self.name} exited ({self.proc and self.proc.returncode})\n{self.log_tail()}"
                )
            if os.path.exists(self.address):
                try:
                    self.cri.version(timeout=1.0)
                    return
                except Exception as exc:  # grpc.RpcError until its CRI is up
                    last = exc
            time.sleep(0.02)
        raise self.error(f"{self.name} not ready after {self.start_timeout}s: {last}\n{self.log_tail()}")

    def _close_cri(self) -> None:
        if self._cri is not None:
            self._cri.close()
            self._cri = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, wait, then SIGKILL. Pods keep running."""
        self._close_cri()
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def kill9(self) -> int:
        """SIGKILL by PID (an OOM kill, a node's kill -9): none of the runtime's shutdown runs.
        Pods live on, and so do the CNI plugins it was running. Returns the exit status."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            raise self.error(f"{self.name} is not running")
        os.kill(proc.pid, signal.SIGKILL)
        status = proc.wait(10)
        # the client goes only after the kill: closing it first would cancel the calls in flight,
        # and the runtime would start tearing them down before it dies
        self._close_cri()
        return status

    def start(self) -> None:
        raise NotImplementedError

    def remove_listed_pods(self, problems: list[str]) -> set[str]:
        """Stop and remove every pod the running runtime lists (their netns seen first, for
        the recording client); returns their ids, adds what failed to `problems`."""
        if not self.running:
            return set()
        try:
            listed = self.cri.list_pods()
        except Exception as exc:
            problems.append(f"ListPodSandbox: {exc}")
            return set()
        for pod in listed:
            try:
                self.cri.pod_status(pod.id)
            except Exception:
                pass
            for step in (self.cri.stop_pod, self.cri.remove_pod):
                try:
                    step(pod.id)
                except Exception as exc:
                    problems.append(f"{step.__name__}({pod.id[:12]}): {exc}")
        return {pod.id for pod in listed}

    def restart(self) -> None:
        """Stop and start again with the same dirs: running pods survive."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no {self.name} log)"
        return "\n".join(text[-lines:])

    def log_offset(self) -> int:
        """Where the log ends now: `wait_logged` looks only at what is written after it."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def wait_logged(self, text: str, offset: int, timeout: float = 60.0) -> None:
        """Waits until the process logs `text` after `offset` (an event it reports, e.g. the start
        of its shutdown). The timeout only bounds a failure."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                if text.encode() in log.read():
                    return
            if time.monotonic() > deadline:
                raise self.error(f"{self.name} did not log {text!r} in {timeout:g}s\n{self.log_tail()}")
            time.sleep(0.02)
