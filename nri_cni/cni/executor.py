"""The seam between the CNI runtime and plugin processes (libcni's invoke.Exec): `Executor`.

`PluginExecutor` (exec.py) is the real one: it finds binaries in the bin dirs (trusted files
only) and runs each call as a process. `FakeExecutor` is an in-process stand-in for what needs
no process: each plugin type answers from the test's table (canned stdout, an error raised, or
a function of the call), and every call is recorded. Wrappers (GC's slots, nri_cni/pod/upkeep.py)
take any Executor and are one themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nri_cni.errors import PluginNotRun, PluginRef


class Executor(Protocol):
    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        """The path of plugin `plugin_type` in `bin_dirs`; PluginNotRun when there is none (or
        none that may be run)."""
        ...

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        """Runs the plugin with `env` and `stdin`; its stdout on success. Raises CNIError when it
        printed a CNI error object, PluginTimeout past `timeout`, PluginExecError otherwise."""
        ...


@dataclass(frozen=True)
class Call:
    """One call a FakeExecutor answered."""

    plugin: str  # the plugin's type (the binary's name)
    command: str  # CNI_COMMAND
    env: dict[str, str]
    stdin: bytes

    def config(self) -> dict[str, Any]:
        return json.loads(self.stdin) if self.stdin.strip() else {}


# what a fake plugin does: prints these bytes, raises this error, or computes either from the call
Answer = bytes | BaseException | Callable[[Call], bytes | BaseException]

ALL_VERSIONS = b'{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}'
FAKE_BIN = "/fake-bin"  # the directory a FakeExecutor's plugins are "found" in


class FakeExecutor:
    """In-process plugins. `plugins` maps a plugin type to its Answer, or to a map of CNI
    command to Answer (a command not in it prints nothing; VERSION, every version)."""

    def __init__(self, plugins: Mapping[str, Answer | Mapping[str, Answer]]) -> None:
        self.plugins = dict(plugins)
        self.calls: list[Call] = []

    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        if plugin_type not in self.plugins:
            raise PluginNotRun(
                f"failed to find plugin {plugin_type!r} in path {list(bin_dirs)}",
                ref=PluginRef(plugin=plugin_type),
            )
        return os.path.join(FAKE_BIN, plugin_type)

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        await asyncio.sleep(0)  # a process takes at least a turn of the loop: what waits on it runs
        call = Call(os.path.basename(plugin_path), env.get("CNI_COMMAND", ""), dict(env), bytes(stdin))
        self.calls.append(call)
        answer = self.plugins[call.plugin]
        if isinstance(answer, Mapping):
            default = ALL_VERSIONS if call.command == "VERSION" else b""
            answer = answer.get(call.command, default)
        if callable(answer):
            answer = answer(call)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def commands(self, plugin: str | None = None) -> list[str]:
        """The CNI commands called, in order (of one plugin type)."""
        return [c.command for c in self.calls if plugin is None or c.plugin == plugin]
