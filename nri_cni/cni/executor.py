"""The seam between the CNI runtime and plugin processes (libcni's invoke.Exec): `Executor`.

`PluginExecutor` (exec.py) is the real one: it finds binaries in the bin dirs (trusted files
only) and runs each call as a process. `FakeExecutor` is an in-process stand-in for what needs
no process: each plugin type answers from the test's table (canned stdout, what a plugin
printed and how it exited, an error raised, something to wait for, or a function of the call),
and every call is recorded. Both refuse the same names and classify what a plugin did the same
way (exec_errors.outcome): timeouts, CNI error objects, output caps (tests/unit/cni/
test_executor_contract.py holds them to it). Wrappers (GC's slots, nri_cni/pod/upkeep.py) take
any Executor and are one themselves.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nri_cni.cni import plugin_process
from nri_cni.cni.exec_errors import Ended, outcome
from nri_cni.errors import PluginNotRun, PluginRef


class Executor(Protocol):
    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        """The path of plugin `plugin_type` in `bin_dirs`; PluginNotRun when there is none (or
        none that may be run)."""
        ...

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        """Runs the plugin with `env` and `stdin`; its stdout on success. Raises CNIError when it
        printed a CNI error object and failed, PluginTimeout past `timeout`, PluginExecError
        otherwise."""
        ...


def check_name(plugin_type: str) -> None:
    """PluginNotRun for a plugin type that is not a plain file name (empty, a path, ., ..)."""
    if not plugin_type or "/" in plugin_type or "\0" in plugin_type or plugin_type in (".", ".."):
        raise PluginNotRun(f"invalid plugin name {plugin_type!r}", ref=PluginRef(plugin=plugin_type))


@dataclass(frozen=True)
class Call:
    """One call a FakeExecutor answered."""

    plugin: str  # the plugin's type (the binary's name)
    command: str  # CNI_COMMAND
    env: dict[str, str]
    stdin: bytes

    def config(self) -> dict[str, Any]:
        return json.loads(self.stdin) if self.stdin.strip() else {}


# What a fake plugin does: prints these bytes and exits 0; prints and exits as Ended says
# (Ended.status: 0 when it succeeded); raises this error; does what an awaitable comes to when
# it comes to it within the call's timeout (a plugin that hangs: an awaitable that never ends);
# or computes any of these from the call.
Outcome = bytes | Ended | BaseException
Answer = Outcome | Awaitable[Outcome] | Callable[[Call], Outcome | Awaitable[Outcome]]

ALL_VERSIONS = b'{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}'
FAKE_BIN = "/fake-bin"  # the directory a FakeExecutor's plugins are "found" in


class FakeExecutor:
    """In-process plugins. `plugins` maps a plugin type to its Answer, or to a map of CNI
    command to Answer (a command not in it prints nothing; VERSION, every version)."""

    def __init__(self, plugins: Mapping[str, Answer | Mapping[str, Answer]]) -> None:
        self.plugins = dict(plugins)
        self.calls: list[Call] = []

    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        check_name(plugin_type)
        if plugin_type not in self.plugins:
            raise PluginNotRun(
                f"failed to find plugin {plugin_type!r} in path {list(bin_dirs)}",
                ref=PluginRef(plugin=plugin_type),
            )
        return os.path.join(FAKE_BIN, plugin_type)

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        await asyncio.sleep(0)  # a process takes at least a turn of the loop: what waits on it runs
        call = Call(os.path.basename(plugin_path), env.get("CNI_COMMAND", ""), dict(env), bytes(stdin))
        ref = PluginRef(plugin=call.plugin, command=call.command)
        self.calls.append(call)
        answer = self.plugins.get(call.plugin)
        if answer is None:
            raise PluginNotRun(f"cannot run plugin {plugin_path}: No such file or directory", ref=ref)
        if isinstance(answer, Mapping):
            default = ALL_VERSIONS if call.command == "VERSION" else b""
            answer = answer.get(call.command, default)
        done = answer(call) if callable(answer) else answer
        if inspect.isawaitable(done):
            try:
                done = await asyncio.wait_for(done, timeout)
            except TimeoutError:
                done = Ended(status=None, timed_out=True)
        if isinstance(done, BaseException):
            raise done
        # bytes: printed, exit 0 (a PluginOutput brings its stderr)
        ended = done if isinstance(done, Ended) else Ended(stdout=done, stderr=getattr(done, "stderr", b""))
        if len(ended.stdout) > plugin_process.MAX_STDOUT:
            ended = Ended(status=None, overflow=True)
        return outcome(ended, plugin_path, ref, timeout)

    def commands(self, plugin: str | None = None) -> list[str]:
        """The CNI commands called, in order (of one plugin type)."""
        return [c.command for c in self.calls if plugin is None or c.plugin == plugin]
