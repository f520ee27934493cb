"""Bounded failure modes, shim mode through containerd 2.1.9.

- Acceptance 5: nri-cni's cache dir on a full tmpfs. The ADD's plugins succeed, the cache write
  fails (ENOSPC): the pod fails with a clear error, the networks are rolled back, no half-written
  cache file is left, nothing leaks; with room again pods work.
- STATUS: a network whose STATUS fails makes `nri-cni status` say so and exit 2 (not ready). By default a
  pod is still attempted; with status.refuse_when_not_ready the pod is refused with the STATUS
  error (nothing is attached), and accepted again as soon as STATUS passes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import uuid

import grpc
import pytest

from tests.support.containerd import umount
from tests.support.recovery_node import pod_ids_in, rnode  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

_libc = ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, f"size={size},mode=0700".encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))


def _fill(directory) -> str:
    """Writes one file until the filesystem is full; returns its path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path


def test_full_cache_dir_fails_the_add_cleanly(rnode):
    cache = rnode.setup.cache_dir
    _mount_tmpfs(cache, "64k")
    rnode.jan.defer(f"umount {cache}", lambda: umount(cache))
    results = cache / "results"
    results.mkdir(mode=0o700)
    filler = _fill(results)

    rnode.start_containerd()
    daemon = rnode.start_daemon(rnode.daemon_config([rnode.podnet(), rnode.fastnet()]))
    checker = rnode.leak_checker().start()
    with pytest.raises(grpc.RpcError) as err:
        rnode.run_pod(f"full-{uuid.uuid4().hex[:6]}")
    msg = str(err.value)
    assert "cannot write CNI cache file" in msg and "No space left on device" in msg, msg
    [op] = [op for op in daemon.op_lines() if op["op"] == "add"]
    checker.add_markers(op["podId"])
    # the networks are ADDed at once (limits.parallel_per_pod): eth0's cache write failed, and
    # both were rolled back, net1 too (it had started with eth0)
    assert sorted((n["network"], n["op"]) for n in op["networks"]) == [
        ("fastnet", "rollback"),
        ("podnet", "rollback"),
    ]
    assert sorted(os.listdir(results)) == ["filler"]  # no entry, no temp file
    assert rnode.reservations() == []
    assert rnode.bridge_ports() == []
    assert rnode.intents() == []
    assert checker.leaks() == []

    os.unlink(filler)
    pod = rnode.run_pod(f"room-{uuid.uuid4().hex[:6]}")
    assert pod_ids_in(daemon) == {pod: ["eth0", "net1"]}
    rnode.remove_pod(pod)
    assert os.listdir(results) == []
    assert rnode.reservations() == []


def _status_cli(daemon) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "status", "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_failure_readiness_and_refuse_when_not_ready(rnode):
    rnode.start_containerd()
    nets = [rnode.podnet(extra_plugins=[rnode.ctl_plugin()], finalize=False)]
    rnode.ctl("status-fail", "1")

    # default: reported, not ready, but pods are still attempted (and work)
    daemon = rnode.start_daemon(rnode.daemon_config(nets))
    cli = _status_cli(daemon)
    assert cli.returncode == 2, cli  # the default network: not ready (a probe's exit code)
    assert "ready:      NO" in cli.stdout and "ctl: upstream agent unreachable" in cli.stdout
    assert daemon.status()["networks"]["podnet"]["ready"] is False
    assert "network podnet is not ready" in daemon.log_path.read_text()
    pod = rnode.run_pod(f"anyway-{uuid.uuid4().hex[:6]}")
    assert pod_ids_in(daemon) == {pod: ["eth0"]}
    rnode.remove_pod(pod)
    daemon.stop()

    # status.refuse_when_not_ready: refused with the STATUS error, nothing attached
    cfg = rnode.daemon_config(nets, status={"interval": 0, "refuse_when_not_ready": True})
    daemon = rnode.start_daemon(cfg)
    checker = rnode.leak_checker().start()
    adds = len([c for c in rnode.ctl_calls() if c[0] == "ADD"])
    with pytest.raises(grpc.RpcError) as err:
        rnode.run_pod(f"refused-{uuid.uuid4().hex[:6]}")
    msg = str(err.value)
    assert "network 'podnet' is not ready" in msg and "ctl: upstream agent unreachable" in msg, msg
    assert "CNI code 50" in msg, msg
    assert len([c for c in rnode.ctl_calls() if c[0] == "ADD"]) == adds  # no plugin ADD ran
    assert rnode.reservations() == [] and rnode.intents() == []
    assert checker.leaks() == []

    # STATUS passes again: the next pod is accepted at once (asked again, not at the next
    # status.interval), and the daemon reports ready
    rnode.ctl("status-fail", None)
    pod = rnode.run_pod(f"ready-{uuid.uuid4().hex[:6]}")
    assert pod_ids_in(daemon) == {pod: ["eth0"]}
    assert _status_cli(daemon).returncode == 0
    rnode.remove_pod(pod)
    assert rnode.reservations() == []
    assert checker.leaks() == []
