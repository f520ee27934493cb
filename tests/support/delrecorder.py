"""A CNI runtime that records the DELs it is given (plugin types, last first) and fails those of
chosen plugins, and a pod plan over it: the rollback and GC tests of tests/unit/pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.executor import FakeExecutor
from nri_cni.config import parse_config
from nri_cni.errors import CNIError, PluginRef
from tests.support.pods import pod_plan

CHAIN = {
    "cniVersion": "1.1.0",
    "name": "podnet",
    "plugins": [{"type": "bridge"}, {"type": "tuning"}, {"type": "ctl"}, {"type": "portmap"}],
}


class DelRecorder:
    """Records each DEL as the plugin types of the (sub-)list it was given, last first."""

    def __init__(self, fail: set[str]) -> None:
        self.fail = fail
        self.calls: list[list[str]] = []
        self.cache = type(
            "C",
            (),
            {
                "read": lambda *a, **k: None,
                "entries": lambda *a, **k: [],
                "delete": lambda *a, **k: None,
                "results_dir": "/nonexistent",
            },
        )()

    def del_prev(self, net, rt, entry=None):
        return None

    async def delete_part(self, net, rt, prev, *, observe=None):
        types = [p.type for p in reversed(net.plugins)]
        self.calls.append(types)
        for t in types:
            if t in self.fail:
                raise CNIError(111, f"{t} DEL failed", ref=PluginRef(plugin=t, command="DEL"))

    async def delete_cached(self, entry, *, observe=None):
        await self.delete_part(parse_conflist(entry.config), None, None)

    async def gc(self, net, valid):
        self.calls.append(["GC", net.name, len(valid)])

    def with_cache(self, cache):
        return self

    executor = FakeExecutor({})  # GC wraps it; this runtime's verbs exec nothing

    def with_executor(self, executor):
        return self


def del_recording_plan(tmp_path: Path, fail: set[str]) -> Any:
    """A pod plan over CHAIN as the default network, its CNI runtime a DelRecorder."""
    cfg = parse_config(
        {"state_dir": str(tmp_path), "networks": [{"name": "podnet", "default": True, "conflist": CHAIN}]},
        str(tmp_path / "c.yaml"),
    )
    return pod_plan(cfg, DelRecorder(fail))
