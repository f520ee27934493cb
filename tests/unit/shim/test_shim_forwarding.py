"""The shim program, both builds: it answers VERSION itself, reports a missing daemon as CNI
error 11 in the caller's cniVersion, and forwards only the CNI_* variables and stdin to the
daemon, printing the daemon's answer (one large enough to be read in pieces) as it came."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from nri_cni.local import proto as localproto
from nri_cni.shim import install

# large enough that the shim reads it in several pieces
ANSWER = b'{"cniVersion":"1.0.0","pad":"' + b"x" * 300_000 + b'"}'
BUILDS = pytest.mark.parametrize("compiled", [True, False], ids=["c", "script"])


def _shim(tmp_path, sock, env, stdin: bytes, compiled: bool):
    path = install(str(tmp_path / "bin"), str(sock), compiled=compiled)
    return subprocess.run([path], input=stdin, env=env, capture_output=True, timeout=10)


@BUILDS
def test_shim_answers_version_and_reports_a_missing_daemon(tmp_path, compiled):
    out = _shim(
        tmp_path, tmp_path / "none.sock", {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}', compiled
    )
    assert out.returncode == 0 and "1.1.0" in json.loads(out.stdout)["supportedVersions"]
    out = _shim(
        tmp_path,
        tmp_path / "none.sock",
        {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x"},
        b'{"cniVersion":"0.4.0","name":"n","type":"nri-cni-shim"}',
        compiled,
    )
    err = json.loads(out.stdout)
    assert out.returncode == 1
    assert err == {
        "cniVersion": "0.4.0",
        "code": 11,
        "details": "No such file or directory",
        "msg": f"nri-cni daemon is not reachable at {tmp_path / 'none.sock'}",
    }


@BUILDS
def test_shim_forwards_env_and_stdin_and_prints_the_answer(tmp_path, compiled):
    sock = tmp_path / "d.sock"
    seen = {}

    async def scenario():
        async def serve(reader, writer):
            seen["header"], seen["body"] = await localproto.read_request(reader)
            writer.write(localproto.encode_response(0, ANSWER))
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(serve, path=str(sock))
        conf = b'{"cniVersion":"1.0.0","name":"n","type":"nri-cni-shim","daemonSocket":"%s"}' % (
            str(sock).encode()
        )
        env = {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "abc",
            "CNI_ARGS": "K8S_POD_NAME=a;b=c",
            "OTHER": "not forwarded",
        }
        path = install(str(tmp_path / "bin"), "/nonexistent/default.sock", compiled=compiled)
        proc = await asyncio.create_subprocess_exec(
            path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        out, _ = await proc.communicate(conf)
        server.close()
        return proc.returncode, out, conf

    code, out, conf = asyncio.run(scenario())
    assert code == 0 and out == ANSWER
    assert seen["header"] == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc",
        "CNI_ARGS": "K8S_POD_NAME=a;b=c",
    }
    assert seen["body"] == conf
