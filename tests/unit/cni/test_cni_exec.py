"""The plugin executor: output handling, errors, timeouts, process groups, fds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nri_cni.cni import exec as cni_exec
from nri_cni.cni import plugin_process as cni_child
from nri_cni.cni.exec import PluginExecutor
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginTimeout

REPO = Path(__file__).resolve().parents[3]
ENV = {
    "PATH": "/usr/bin:/bin",
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": "/x",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "IgnoreUnknown=1",
    "CNI_PATH": "/nowhere",
}


def run(coro):
    return asyncio.run(coro)


def fake(fake_bin, act: dict, command: str = "ADD", timeout: float = 10.0, **conf):
    stdin = json.dumps({"type": "fake", "cniVersion": "1.1.0", "fake": {command: act}, **conf}).encode()
    env = dict(ENV, CNI_COMMAND=command)
    return run(PluginExecutor().exec(str(fake_bin / "fake"), env, stdin, timeout))


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies. (Killed orphans are reaped by PID 1,
    which on some machines takes a second or two: a zombie has stopped running.)"""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def group_gone(pgid: int, within: float = 30.0) -> bool:
    end = time.monotonic() + within
    while live_members(pgid):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_success_returns_stdout_and_env(fake_bin, tmp_path):
    log = tmp_path / "log"
    out = fake(fake_bin, {"result": {"cniVersion": "1.1.0"}, "stderr": "note"}, log=str(log))
    assert json.loads(out) == {"cniVersion": "1.1.0"}
    assert out.stderr == b"note"
    call = json.loads(log.read_text())
    assert call["env"] == ENV  # exactly what was passed, nothing else of ours
    assert call["stdin"]["fake"]["ADD"]["stderr"] == "note"


def test_empty_output_is_returned(fake_bin):
    assert fake(fake_bin, {}, command="DEL") == b""


def test_cni_error_object(fake_bin):
    with pytest.raises(CNIError) as err:
        fake(fake_bin, {"error": {"code": 11, "msg": "busy", "details": "try later"}})
    exc = err.value
    assert type(exc) is CNIError and (exc.code, exc.msg, exc.details) == (11, "busy", "try later")
    assert (exc.ref.plugin, exc.ref.command) == ("fake", "ADD")


def test_nonzero_exit_without_output(fake_bin):
    with pytest.raises(PluginExecError) as err:
        fake(fake_bin, {"exit": 3, "stderr": "cannot open /dev/net/tun"})
    assert "exit status 3" in str(err.value) and "no output" in str(err.value)
    assert "cannot open /dev/net/tun" in str(err.value)


def test_stderr_tail_kept(fake_bin):
    with pytest.raises(PluginExecError) as err:
        run(PluginExecutor().exec(str(fake_bin / "chatty"), ENV, b"{}", 10))
    details = err.value.details
    assert "the real reason" in details and "noise line 0\\n" not in details
    assert details.count("noise line") <= cni_exec.STDERR_TAIL // len("noise line 1999\n") + 1


def test_garbage_output_on_failure(fake_bin):
    with pytest.raises(PluginExecError) as err:
        fake(fake_bin, {"print": "panic: runtime error " + "x" * 500, "exit": 2, "stderr": "goroutine 1"})
    msg = str(err.value)
    assert "not a CNI error" in msg and "panic: runtime error" in msg and "goroutine 1" in msg
    assert "x" * 250 not in msg  # only the first ~200 bytes
    assert err.value.code == CniCode.DECODING_FAILURE


def test_killed_by_signal(fake_bin, tmp_path):
    script = tmp_path / "bin" / "selfkill"
    script.write_text("#!/bin/sh\nkill -9 $$\n")
    script.chmod(0o755)
    with pytest.raises(PluginExecError, match="killed by signal 9"):
        run(PluginExecutor().exec(str(script), ENV, b"", 10))


def test_timeout_kills_process_group(fake_bin, tmp_path, spawned):
    """Whatever of its group the plugin started before its timeout is killed with it (the
    group it surely started: test_cancel_kills_and_reaps, the same kill)."""
    pidfile = tmp_path / "hang.pid"
    before = open_fds()
    with pytest.raises(PluginTimeout) as err:  # the plugin hangs: only its timeout ends the call
        run(PluginExecutor().exec(str(fake_bin / "hang"), dict(ENV, HANG_PIDFILE=str(pidfile)), b"{}", 0.5))
    assert "timeout" in str(err.value)
    [pgid] = spawned  # known from the spawn: the plugin may be killed before it writes its pidfile
    assert group_gone(pgid), "the plugin's process group survived the timeout"
    with pytest.raises(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)  # reaped: no zombie left
    assert open_fds() == before


def test_cancel_kills_and_reaps(fake_bin, tmp_path):
    pidfile = tmp_path / "hang.pid"
    before = open_fds()

    async def go():
        in_loop = open_fds()  # plus the loop's own epoll fd and self-pipe
        task = asyncio.create_task(
            PluginExecutor().exec(str(fake_bin / "hang"), dict(ENV, HANG_PIDFILE=str(pidfile)), b"{}", 30)
        )
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pgid = int(pidfile.read_text())
        deadline = time.monotonic() + 60  # the loop keeps watching the pidfd and reaps the child
        while open_fds() != in_loop and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert open_fds() == in_loop
        return pgid

    pgid = run(go())
    assert group_gone(pgid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)  # already reaped: no zombie left
    assert open_fds() == before


def test_large_stdin_and_stdout(fake_bin, tmp_path):
    blob = "y" * (300 << 10)  # more than a pipe holds, both ways
    out = fake(fake_bin, {"result": {"echo": blob}}, pad=blob)
    assert json.loads(out)["echo"] == blob


def test_stdout_limit(fake_bin, monkeypatch):
    monkeypatch.setattr(cni_child, "MAX_STDOUT", 1000)
    with pytest.raises(PluginExecError, match="more than 1000 bytes"):
        fake(fake_bin, {"print": "z" * 5000})


def test_signals_restored_for_plugins(fake_bin):
    out = run(PluginExecutor().exec(str(fake_bin / "sigstate"), ENV, b"", 10)).decode()
    state = dict(line.split(":\t") for line in out.splitlines())
    # Python ignores SIGPIPE and SIGXFSZ; a plugin (and the iptables it runs) must not.
    # Signals 32/33 are glibc's internal ones: its posix_spawn leaves them ignored, and both
    # glibc and Go install their own handlers for them at start-up, so only 1-31 matter.
    assert int(state["SigIgn"], 16) & 0x7FFFFFFF == 0  # bit n-1 is signal n
    assert int(state["SigBlk"], 16) == 0


# A process started as under nohup and a supervisor that ignores more: these signals ignored,
# SIGUSR1 blocked, both inherited through exec. It then starts the probe `how`: "executor"
# through PluginExecutor, "bare" (the control) with a posix_spawn that resets nothing.
INHERITED_IGNORED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR2, signal.SIGRTMIN + 1)
INHERITED_BLOCKED = signal.SIGUSR1
SPAWNER = """
import asyncio, os, sys
from nri_cni.cni.exec import PluginExecutor

probe, how = sys.argv[1:]
env = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": "VERSION"}
if how == "executor":
    out = asyncio.run(PluginExecutor().exec(probe, env, b"", 60))
else:
    r, w = os.pipe()
    pid = os.posix_spawn(probe, [probe], env, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
    os.close(w)
    out = b"".join(iter(lambda: os.read(r, 4096), b""))
    os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
"""


def _as_under_nohup() -> None:
    for sig in INHERITED_IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {INHERITED_BLOCKED})


def probe_signals(fake_bin, how: str) -> tuple[set[int], set[int]]:
    """The signals the probe found ignored and blocked, started from a spawner that inherited
    INHERITED_IGNORED and INHERITED_BLOCKED."""
    proc = subprocess.run(
        [sys.executable, "-c", SPAWNER, str(fake_bin / "sigstate"), how],
        preexec_fn=_as_under_nohup,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    state = dict(line.split(":\t") for line in proc.stdout.splitlines())
    masks = int(state["SigIgn"], 16), int(state["SigBlk"], 16)
    # Signals 32 and 33 are glibc's internal ones: its posix_spawn leaves them as they were, and
    # glibc and Go install their own handlers for them at start-up.
    return tuple({n for n in range(1, 65) if mask >> (n - 1) & 1 and n not in (32, 33)} for mask in masks)


def test_plugins_start_with_no_signal_ignored_or_blocked_whatever_the_daemon_inherited(fake_bin):
    ignored, blocked = probe_signals(fake_bin, "executor")
    assert (ignored, blocked) == (set(), set())


def test_control_a_spawn_without_the_reset_passes_the_inherited_signals_on(fake_bin):
    """The control case of the test above: the probe sees what the spawner inherited."""
    ignored, blocked = probe_signals(fake_bin, "bare")
    assert set(INHERITED_IGNORED) <= ignored
    assert blocked == {INHERITED_BLOCKED}


def test_not_executable(fake_bin, tmp_path):
    path = tmp_path / "bin" / "noexec"
    path.write_text("#!/bin/sh\n")
    with pytest.raises(PluginExecError, match="cannot run plugin.*Permission denied"):
        run(PluginExecutor().exec(str(path), ENV, b"", 10))


def test_text_file_busy_retried(fake_bin, tmp_path):
    path = tmp_path / "bin" / "busy"
    path.write_text("#!/bin/sh\necho '{}'\n")
    path.chmod(0o755)
    writer = os.open(path, os.O_WRONLY)  # exec of a file open for writing fails with ETXTBSY

    async def go():
        asyncio.get_running_loop().call_later(0.12, os.close, writer)
        return await PluginExecutor().exec(str(path), ENV, b"", 10)

    assert run(go()).strip() == b"{}"


def test_find(fake_bin, tmp_path):
    ex = PluginExecutor()
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "fake-b").mkdir()  # a directory is not a plugin
    assert ex.find("fake-b", [str(tmp_path / "first"), str(fake_bin)]) == str(fake_bin / "fake-b")
    with pytest.raises(PluginExecError) as err:
        ex.find("nct-missing", [str(tmp_path / "first"), str(fake_bin)])
    assert "nct-missing" in str(err.value) and str(tmp_path / "first") in str(err.value)
    with pytest.raises(PluginExecError, match="invalid plugin name"):
        ex.find("../fake", [str(fake_bin)])


def test_concurrent_calls(fake_bin):
    async def go():
        ex = PluginExecutor()
        stdin = [
            json.dumps({"fake": {"ADD": {"result": {"n": i}, "sleep": 0.05}}}).encode() for i in range(8)
        ]
        return await asyncio.gather(*(ex.exec(str(fake_bin / "fake"), ENV, s, 10) for s in stdin))

    assert [json.loads(o)["n"] for o in run(go())] == list(range(8))


def _closer(tmp_path, body: str):
    """A plugin that prints a result, closes stdout and stderr, then does `body`."""
    script = tmp_path / "bin" / "closer"
    script.parent.mkdir(exist_ok=True)
    script.write_text('#!/bin/sh\necho \'{"cniVersion":"1.1.0"}\'\nexec >&- 2>&-\n' + body)
    script.chmod(0o755)
    return str(script)


def test_exit_after_closing_output_is_waited_for(tmp_path):
    # EOF on both pipes is not the exit: the status must be the one the plugin exits with
    path = _closer(tmp_path, "sleep 0.3\nexit 3\n")
    before = open_fds()
    with pytest.raises(PluginExecError, match="exit status 3"):  # known only once it exited
        run(PluginExecutor().exec(path, ENV, b"{}", 10))
    assert open_fds() == before
    ok = _closer(tmp_path, "sleep 0.2\nexit 0\n")
    assert json.loads(run(PluginExecutor().exec(ok, ENV, b"{}", 10))) == {"cniVersion": "1.1.0"}


def test_timeout_after_closing_output(tmp_path):
    pidfile = tmp_path / "closer.pid"
    path = _closer(tmp_path, f"echo $$ > {pidfile}\nexec sleep 30\n")
    before = open_fds()
    with pytest.raises(PluginTimeout):  # (waited for, it would exit 0 after 30 s)
        run(PluginExecutor().exec(path, ENV, b"{}", 0.5))
    pid = int(pidfile.read_text())
    assert group_gone(pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left
    assert open_fds() == before


def test_exit_polled_when_no_pidfd(tmp_path, monkeypatch):
    # out of fds for a pidfd: the exit is polled instead, the status still exact
    def no_pidfd(pid):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(cni_exec.os, "pidfd_open", no_pidfd)
    path = _closer(tmp_path, "sleep 0.1\nexit 4\n")
    with pytest.raises(PluginExecError, match="exit status 4"):
        run(PluginExecutor().exec(path, ENV, b"{}", 10))


def test_helper_holding_stdout_does_not_hold_the_call(tmp_path):
    """The exit ends a call: a background helper that inherited stdout is not waited for."""
    pidfile = tmp_path / "helper.pid"
    script = tmp_path / "bin" / "forker"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\nsleep 3600 &\necho $! > {pidfile}\necho \'{{"cniVersion":"1.1.0"}}\'\n')
    script.chmod(0o755)
    try:
        # a call that waited for the helper's stdout would end in the plugin timeout (60 s)
        out = run(PluginExecutor().exec(str(script), ENV, b"{}", 60))
        assert json.loads(out) == {"cniVersion": "1.1.0"}
    finally:
        os.kill(int(pidfile.read_text()), 9)


def test_stdout_flood_killed(tmp_path, monkeypatch):
    """A plugin printing without end is killed once past MAX_STDOUT; nri-cni holds no more."""
    monkeypatch.setattr(cni_child, "MAX_STDOUT", 1000)
    script = tmp_path / "bin" / "flood"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\nexec cat /dev/zero\n")
    script.chmod(0o755)
    held = []
    real = cni_child.ChildRun._read_stdout

    def spy(self):
        real(self)
        held.append(self.stdout_len)

    monkeypatch.setattr(cni_child.ChildRun, "_read_stdout", spy)
    with pytest.raises(PluginExecError, match="more than 1000 bytes"):  # not its timeout: killed
        run(PluginExecutor().exec(str(script), ENV, b"", 60))
    assert max(held) <= 1000 + (1 << 18)  # one read past the limit at most


def test_dev_stdio_idioms(tmp_path):
    """Shell plugins read `/dev/stdin` and write `> /dev/stdout`, `> /dev/stderr`: reopened
    via /proc, every stream must allow that (pipes and an unsealed memory file do)."""
    script = tmp_path / "bin" / "devstd"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        "#!/bin/sh\nconf=$(cat /dev/stdin)\necho 'note' > /dev/stderr\necho \"$conf\" > /dev/stdout\n"
    )
    script.chmod(0o755)
    out = run(PluginExecutor().exec(str(script), ENV, b'{"cniVersion":"1.1.0"}', 10))
    assert json.loads(out) == {"cniVersion": "1.1.0"} and out.stderr == b"note\n"


def test_big_output_of_a_slow_plugin(tmp_path):
    """Output bigger than a pipe holds, written after the drain time: read as it comes."""
    blob = tmp_path / "big.json"
    blob.write_text(json.dumps({"cniVersion": "1.1.0", "x": "q" * (200 << 10)}))
    script = tmp_path / "bin" / "slowbig"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\nsleep 0.2\ncat {blob}\n")
    script.chmod(0o755)
    out = run(PluginExecutor().exec(str(script), ENV, b"{}", 10))
    assert json.loads(out)["x"] == "q" * (200 << 10)


def test_no_fd_left_after_calls(fake_bin):
    """A call's fds are closed right after it returned (in the loop iteration that resumes
    the caller), also when the loop ends with it."""
    before = open_fds()

    async def go():
        in_loop = open_fds()
        for _ in range(5):
            await PluginExecutor().exec(
                str(fake_bin / "fake"),
                ENV,
                json.dumps({"type": "fake", "cniVersion": "1.1.0", "fake": {"ADD": {}}}).encode(),
                10,
            )
        await asyncio.sleep(0)
        assert open_fds() == in_loop
        await PluginExecutor().exec(
            str(fake_bin / "fake"),
            ENV,
            json.dumps({"type": "fake", "cniVersion": "1.1.0", "fake": {"ADD": {}}}).encode(),
            10,
        )

    run(go())
    assert open_fds() == before


def test_daemon_with_stdio_closed(tmp_path):
    """A daemon started with fds 0-2 closed: the fds made for a plugin land on 0-2 and must be
    moved off them, or the plugin would lose its stdin, stdout or stderr."""
    plugin = tmp_path / "echo"
    plugin.write_text("#!/bin/sh\ncat\necho note >&2\n")
    plugin.chmod(0o755)
    out = tmp_path / "out.json"
    code = f"""
import asyncio, json, os
from nri_cni.cni.exec import PluginExecutor

async def main():
    for fd in (0, 1, 2):  # the loop's own fds are above them: they were open when it started
        os.close(fd)
    return await PluginExecutor().exec({str(plugin)!r}, {{"PATH": "/usr/bin:/bin"}}, b'{{"a": 1}}', 10)

res = asyncio.run(main())
with open({str(out)!r}, "w") as f:
    json.dump({{"stdout": res.decode(), "stderr": res.stderr.decode()}}, f)
"""
    import subprocess
    import sys as _sys

    subprocess.run(
        [_sys.executable, "-c", code],
        check=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert json.loads(out.read_text()) == {"stdout": '{"a": 1}', "stderr": "note\n"}
