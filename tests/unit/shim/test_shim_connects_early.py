"""The compiled shim connects to the daemon before the runtime's config has come on stdin
(containerd writes it 1-3 ms after the exec), so the daemon accepts meanwhile; a config that names
another socket gets a connection of its own, and the first is closed without a byte (the daemon
takes that for no request: tests/unit/local/test_local_protocol.py). The script build connects
after reading stdin: the control."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess

import pytest

from nri_cni.local import proto as localproto
from nri_cni.shim import install

CONF = {"cniVersion": "1.0.0", "name": "n", "type": "nri-cni-shim"}


def _listener(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def _waits_on_stdin(proc: subprocess.Popen) -> bool:
    """Spins until the shim sleeps reading its stdin pipe (True), or has exited (False)."""
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/wchan") as f:
                if "pipe_read" in f.read():
                    return True
        except FileNotFoundError:
            break
    return False


def _pending(listener: socket.socket) -> bool:
    """A connection waits to be accepted (a look, not a wait)."""
    return bool(select.select([listener], [], [], 0)[0])


def _answer(listener: socket.socket) -> tuple[dict, bytes]:
    conn, _ = listener.accept()
    with conn:
        f = conn.makefile("rb")
        hlen = int.from_bytes(f.read(4), "big")
        header = dict(e.split("=", 1) for e in f.read(hlen).decode().split("\0") if e)
        body = f.read(int.from_bytes(f.read(4), "big"))
        conn.sendall(localproto.encode_response(0, b'{"cniVersion":"1.0.0"}'))
    return header, body


@pytest.mark.parametrize("compiled, early", [(True, True), (False, False)], ids=["c", "script-control"])
def test_the_compiled_shim_is_connected_while_stdin_comes(tmp_path, compiled, early):
    sock = tmp_path / "d.sock"
    listener = _listener(sock)
    shim = install(str(tmp_path / "bin"), str(sock), compiled=compiled)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "PATH": os.environ.get("PATH", "")}
    proc = subprocess.Popen([shim], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert _waits_on_stdin(proc)
        assert _pending(listener) is early
        proc.stdin.write(json.dumps(CONF).encode())
        proc.stdin.close()
        header, body = _answer(listener)
        assert header["CNI_COMMAND"] == "ADD" and json.loads(body) == CONF
        assert proc.wait() == 0 and json.loads(proc.stdout.read()) == {"cniVersion": "1.0.0"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()


def test_a_config_naming_another_socket_leaves_the_early_connection_unused(tmp_path):
    default, named = tmp_path / "default.sock", tmp_path / "named.sock"
    first, second = _listener(default), _listener(named)
    shim = install(str(tmp_path / "bin"), str(default), compiled=True)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1"}
    proc = subprocess.Popen([shim], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert _waits_on_stdin(proc)
        assert _pending(first)  # made before the config came
        early, _ = first.accept()
        proc.stdin.write(json.dumps({**CONF, "daemonSocket": str(named)}).encode())
        proc.stdin.close()
        header, _ = _answer(second)
        assert header["CNI_COMMAND"] == "DEL"
        assert proc.wait() == 0
        assert early.recv(1) == b""  # closed, nothing sent
        early.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        first.close()
        second.close()
