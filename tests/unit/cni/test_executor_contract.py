"""The contract every Executor keeps (nri_cni/cni/executor.py), held by both: FakeExecutor (in
process) and PluginExecutor (real processes, nri_cni/cni/exec.py). The same plugin behaviour is
given to each (a script for the real one, an Answer for the fake) and must come to the same
result or the same error, message included: names refused, a plugin missing, CNI error objects,
garbage, a crash, a timeout, the output cap."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_cni.cni import plugin_process
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import Executor, FakeExecutor
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginNotRun, PluginTimeout
from tests.support.bin_dir import install_plugin

ENV = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}
TIMEOUT = 30.0  # generous: only the hanging plugin reaches it
HANG_TIMEOUT = 0.5  # the hanging plugin's: only a lower bound on how long the test takes


@dataclass(frozen=True)
class Prints:
    """A plugin that prints `stdout` (and `stderr`) and then exits `status` (-N: killed by
    signal N)."""

    stdout: bytes = b""
    stderr: bytes = b""
    status: int = 0


class Hangs:
    """A plugin that never exits."""


Behaviour = Prints | Hangs


class Plugins:
    """One Executor and a bin dir it finds plugins in; `add` gives a plugin a behaviour."""

    def __init__(self, kind: str, bin_dir: Path) -> None:
        self.kind = kind
        self.bin_dir = bin_dir
        self.fake = FakeExecutor({})
        self.executor: Executor = PluginExecutor() if kind == "real" else self.fake

    def add(self, name: str, behaviour: Behaviour) -> None:
        if self.kind == "fake":
            if isinstance(behaviour, Hangs):
                self.fake.plugins[name] = lambda call: asyncio.get_running_loop().create_future()
            else:
                self.fake.plugins[name] = Ended(behaviour.stdout, behaviour.stderr, behaviour.status)
            return
        if isinstance(behaviour, Hangs):
            install_plugin(self.bin_dir, name, "#!/bin/sh\nexec sleep 1000\n")
        else:
            out, err = self.bin_dir / f".{name}.out", self.bin_dir / f".{name}.err"
            out.write_bytes(behaviour.stdout)
            err.write_bytes(behaviour.stderr)
            end = f"kill -{-behaviour.status} $$" if behaviour.status < 0 else f"exit {behaviour.status}"
            script = f"#!/bin/sh\ncat {shlex.quote(str(out))}\ncat {shlex.quote(str(err))} >&2\n{end}\n"
            install_plugin(self.bin_dir, name, script)

    def call(self, name: str, timeout: float = TIMEOUT) -> bytes:
        path = self.executor.find(name, [str(self.bin_dir)])
        return asyncio.run(self.executor.exec(path, dict(ENV), b'{"cniVersion":"1.1.0"}', timeout))


@pytest.fixture(params=["fake", "real"])
def plugins(request, tmp_path: Path) -> Plugins:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return Plugins(request.param, bin_dir)


def test_a_plugin_that_exits_0_gives_its_stdout_and_keeps_its_stderr_for_messages(plugins):
    plugins.add("ok", Prints(b'{"cniVersion":"1.1.0"}', stderr=b"said something"))
    out = plugins.call("ok")
    assert out == b'{"cniVersion":"1.1.0"}'
    assert out.stderr == b"said something"  # type: ignore[attr-defined]


def test_exit_0_with_garbage_or_nothing_is_returned_as_printed(plugins):
    """Judging a result is the runtime's work (result_parse), not the executor's."""
    plugins.add("garbage", Prints(b"\xff\xfenot json"))
    plugins.add("silent", Prints(b""))
    assert plugins.call("garbage") == b"\xff\xfenot json"
    assert plugins.call("silent") == b""


ERROR_OBJECT = b'{"cniVersion":"1.1.0","code":7,"msg":"bad address","details":"10.0.0.300"}'


def test_a_cni_error_object_and_a_failed_exit_raise_that_error(plugins):
    plugins.add("refuses", Prints(ERROR_OBJECT, status=1))
    with pytest.raises(CNIError) as caught:
        plugins.call("refuses")
    assert type(caught.value) is CNIError
    assert (caught.value.code, caught.value.msg, caught.value.details) == (7, "bad address", "10.0.0.300")
    assert (caught.value.ref.plugin, caught.value.ref.command) == ("refuses", "ADD")


def test_control_the_same_error_object_with_exit_0_is_output(plugins):
    plugins.add("says-error", Prints(ERROR_OBJECT, status=0))
    assert plugins.call("says-error") == ERROR_OBJECT


@pytest.mark.parametrize(
    "stdout, stderr, status, message",
    [
        (b"", b"the reason", 1, "plugin failing failed (exit status 1) with no output: stderr 'the reason'"),
        (
            b"\xffgarbage",
            b"",
            2,
            "plugin failing failed (exit status 2) and its output is not a CNI error: stdout '\ufffdgarbage'",
        ),
        (
            b'{"code":"7","msg":"a string code"}',
            b"",
            1,
            "plugin failing failed (exit status 1) and its output is not a CNI error: "
            'stdout \'{"code":"7","msg":"a string code"}\'',
        ),
        (b"", b"", -9, "plugin failing failed (killed by signal 9) with no output"),
    ],
    ids=["no-output", "garbage", "code-not-int", "killed"],
)
def test_a_failure_without_an_error_object_is_an_exec_error_quoting_the_output(
    plugins, stdout, stderr, status, message
):
    plugins.add("failing", Prints(stdout, stderr, status))
    with pytest.raises(PluginExecError) as caught:
        plugins.call("failing")
    assert type(caught.value) is PluginExecError
    assert caught.value.msg + (f": {caught.value.details}" if caught.value.details else "") == message
    expected = CniCode.DECODING_FAILURE if stdout else CniCode.INTERNAL
    assert caught.value.code == expected


def test_a_plugin_past_its_timeout_is_a_timeout(plugins):
    plugins.add("hangs", Hangs())
    with pytest.raises(PluginTimeout) as caught:
        plugins.call("hangs", timeout=HANG_TIMEOUT)
    assert caught.value.msg == f"plugin hangs killed after {HANG_TIMEOUT:g}s timeout"


def test_control_a_plugin_that_exits_before_its_timeout_is_no_timeout(plugins):
    """The one thing changed: the plugin exits. Its timeout is the generous one, so a loaded
    machine cannot make the exec itself outlast it (a wall-clock race the test would lose)."""
    plugins.add("quick", Prints(b"{}"))
    assert plugins.call("quick", timeout=TIMEOUT) == b"{}"


@pytest.mark.parametrize("size, refused", [(1000, False), (1001, True)], ids=["at-the-cap", "past-it"])
def test_output_past_the_cap_is_refused(plugins, monkeypatch, size, refused):
    monkeypatch.setattr(plugin_process, "MAX_STDOUT", 1000)
    plugins.add("chatty", Prints(b"z" * size))
    if not refused:  # the control: the same plugin one byte shorter
        assert plugins.call("chatty") == b"z" * size
        return
    with pytest.raises(PluginExecError) as caught:
        plugins.call("chatty")
    assert type(caught.value) is PluginExecError
    assert caught.value.msg == "plugin chatty printed more than 1000 bytes"


@pytest.mark.parametrize("name", ["", ".", "..", "../ok", "sub/ok", "/bin/sh", "ok\0"])
def test_a_plugin_type_that_is_not_a_plain_name_is_refused(plugins, name):
    plugins.add("ok", Prints(b"{}"))
    with pytest.raises(PluginNotRun) as caught:
        plugins.executor.find(name, [str(plugins.bin_dir)])
    assert caught.value.msg == f"invalid plugin name {name!r}"


def test_control_the_plain_name_is_found_and_runs(plugins):
    plugins.add("ok", Prints(b"{}"))
    assert plugins.call("ok") == b"{}"


def test_a_missing_plugin_is_not_found(plugins):
    plugins.add("ok", Prints(b"{}"))
    with pytest.raises(PluginNotRun) as caught:
        plugins.executor.find("absent", [str(plugins.bin_dir)])
    assert caught.value.msg == f"failed to find plugin 'absent' in path {[str(plugins.bin_dir)]}"
