"""Sockets and dirs: what the daemon creates is private whatever umask it inherited;
the local socket checks its peer's credentials (SO_PEERCRED), closes a connection that does
not send a whole request in time, caps its connections and the request size; the daemon keeps
serving normal ADD/DELs through all of it."""

from __future__ import annotations

import asyncio
import os
import stat
import struct
import subprocess
import tempfile

import pytest

from nri_cni.local import proto as localproto
from tests.support.harness import new_pod_id, run
from tests.support.secharness import install_shim, netns_path, normal_add_del, shim_config, started

pytestmark = pytest.mark.netns  # a daemon, network namespaces, root


async def _closed_by_daemon(reader) -> bool:
    """The daemon closed the connection without answering (EOF, or a reset: it closed with
    our bytes unread)."""
    try:
        return await asyncio.wait_for(reader.read(), 60) == b""
    except ConnectionResetError:
        return True


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_state_dirs_files_and_socket_are_private_under_umask_000(node):
    netns_path(node)
    old = os.umask(0)
    try:

        async def scenario():
            h = await started(node, shim_config(node))
            try:
                shim = install_shim(node, True)
                cid = new_pod_id()
                from tests.support.secharness import call_shim

                code, _, raw = await call_shim(shim, "ADD", cid, netns=netns_path(node))
                assert code == 0, raw
                sock = node.tmp / "daemon.sock"
                assert stat.S_IMODE(os.stat(sock).st_mode) & 0o077 == 0
                made = {**_modes(node.state_dir), **_modes(node.cache_dir)}
                made["<state>"] = stat.S_IMODE(os.stat(node.state_dir).st_mode)
                made["<cache>"] = stat.S_IMODE(os.stat(node.cache_dir).st_mode)
                loose = {k: oct(m) for k, m in made.items() if m & 0o077}
                assert not loose, loose
                code, _, raw = await call_shim(shim, "DEL", cid, netns=netns_path(node))
                assert code == 0, raw
            finally:
                await h.stop()

        run(scenario())
    finally:
        os.umask(old)


_CLIENT = r"""
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
head = b"NRICNI_OP=status"
s.sendall(struct.pack(">I", len(head)) + head + struct.pack(">I", 0))
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(str(len(data)))
"""


def test_a_client_that_is_not_root_gets_no_answer_even_through_an_open_socket(node):
    netns_path(node)
    sockdir = tempfile.mkdtemp(prefix="nri-cni-sec-", dir="/tmp")
    node.jan.track_path(sockdir)
    os.chmod(sockdir, 0o755)
    sock = os.path.join(sockdir, "d.sock")
    cfg = shim_config(node)
    cfg["daemon"] = {"socket": sock}

    async def scenario():
        h = await started(node, cfg)
        try:
            os.chmod(sock, 0o666)  # the window the old bind-then-chmod left open
            for user in (65534, 0):
                proc = await asyncio.create_subprocess_exec(
                    "/usr/bin/python3",
                    "-I",
                    "-c",
                    _CLIENT,
                    sock,
                    stdout=asyncio.subprocess.PIPE,
                    user=user,
                    group=user,
                )
                out, _ = await asyncio.wait_for(proc.communicate(), 30)
                answered = int(out or b"0")
                assert (answered > 0) == (user == 0), (user, answered)
        finally:
            await h.stop()

    run(scenario())


def test_an_allowed_group_gets_access_and_an_answer(node):
    netns_path(node)
    sockdir = tempfile.mkdtemp(prefix="nri-cni-sec-", dir="/tmp")
    node.jan.track_path(sockdir)
    sock = os.path.join(sockdir, "d.sock")
    cfg = shim_config(node)
    cfg["daemon"] = {"socket": sock, "allowed_gids": [65534]}

    async def scenario():
        h = await started(node, cfg)
        try:
            st = os.stat(sock)
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == 65534
            proc = await asyncio.create_subprocess_exec(
                "/usr/bin/python3",
                "-I",
                "-c",
                _CLIENT,
                sock,
                stdout=asyncio.subprocess.PIPE,
                user=1234,
                group=65534,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            assert int(out or b"0") > 0
        finally:
            await h.stop()

    run(scenario())


def test_half_sent_requests_are_closed_and_idle_connections_are_capped(node):
    netns_path(node)
    cfg = shim_config(node)
    cfg["daemon"] = {
        "socket": str(node.tmp / "daemon.sock"),
        "max_connections": 8,
        "read_timeout": "300ms",
    }

    async def scenario():
        h = await started(node, cfg)
        try:
            shim = install_shim(node, True)
            path = str(node.tmp / "daemon.sock")
            conns = []
            for _ in range(60):
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(b"\x00\x00\x00\x10CNI_")  # a header that never ends
                await writer.drain()
                conns.append((reader, writer))
            # every one is closed by the daemon: at once past the cap, the rest at the timeout
            for reader, _ in conns:
                assert await _closed_by_daemon(reader)
            for _, writer in conns:
                writer.close()
            assert h.daemon.local.guard.open == 0
            await normal_add_del(shim, node, new_pod_id())
            # a request over the size cap is refused before its body is read
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(struct.pack(">I", 4) + b"A=bc" + struct.pack(">I", localproto.MAX_BODY))
            await writer.drain()
            assert await _closed_by_daemon(reader)
            writer.close()
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


def test_the_cli_still_talks_to_the_daemon(node):
    netns_path(node)

    async def scenario():
        h = await started(node, shim_config(node))
        try:
            status, payload = await asyncio.to_thread(
                localproto.call, str(node.tmp / "daemon.sock"), {localproto.OP_KEY: "status"}
            )
            assert status == 0 and payload.startswith(b"{")
        finally:
            await h.stop()

    run(scenario())


def test_peer_check_without_a_subprocess_user_switch():
    """peer_allowed: root by uid, others by the configured uids or gids only."""
    from nri_cni.local.guard import Peer, peer_allowed

    assert peer_allowed(Peer(1, 0, 0), (0,), ())
    assert not peer_allowed(Peer(1, 1000, 1000), (0,), ())
    assert peer_allowed(Peer(1, 1000, 1000), (0,), (1000,))
    assert peer_allowed(Peer(1, 1000, 5), (0, 1000), ())
    assert not peer_allowed(None, (0,), ())
    assert subprocess.run(["true"]).returncode == 0
