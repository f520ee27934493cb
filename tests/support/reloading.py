"""Hot reload without a daemon: a config a ConfigReloader watches, written as editors do, and
what the reloader applies or refuses (tests/unit/daemon/test_reload.py and its neighbours)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from nri_cni.config import load_config
from nri_cni.daemon.reload import ConfigReloader


def base_config(tmp: Path, networks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A native-mode config under `tmp` that watches its files (rescan off, 50 ms debounce)."""
    (tmp / "net.d" / "_finalize.d").mkdir(parents=True, exist_ok=True)
    return {
        "mode": "native",
        "nri": {"socket": str(tmp / "nri.sock")},
        "daemon": {"socket": str(tmp / "daemon.sock")},
        "state_dir": str(tmp / "state"),
        "cni": {
            "bin_dirs": [str(tmp / "bin")],
            "cache_dir": str(tmp / "cache"),
            "finalize_dir": str(tmp / "net.d" / "_finalize.d"),
        },
        "reload": {"watch": True, "rescan_interval": 0, "debounce": "50ms"},
        "networks": networks,
        **extra,
    }


def inline(name: str, *, default: bool = False, plugin_type: str = "fake-ok", **keys: Any) -> dict[str, Any]:
    """A network entry with its one-plugin list inline."""
    return {
        "name": name,
        "default": default,
        "conflist": {"cniVersion": "1.1.0", "name": name, "plugins": [{"type": plugin_type, **keys}]},
    }


def write(path: Path, text: str) -> None:
    """As editors and ConfigMaps do: a new file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.rename(tmp, path)


class Applied:
    """The reloader's `apply`: records each config it is given."""

    def __init__(self) -> None:
        self.configs: list[Any] = []
        self.event = asyncio.Event()

    async def __call__(self, cfg: Any) -> None:
        self.configs.append(cfg)
        self.event.set()

    async def next(self, timeout: float = 60.0) -> Any:
        await asyncio.wait_for(self.event.wait(), timeout)
        self.event.clear()
        return self.configs[-1]


async def refusal(reloader: ConfigReloader, cleared: bool = False, timeout: float = 60.0) -> str:
    """Waits for the reloader to report a refused change (`cleared`: to report none any more),
    the event a refused write causes; the deadline only fails a hang. Returns the report's text."""
    deadline = time.monotonic() + timeout
    while bool(reloader.report()["refused"]) == cleared:
        assert time.monotonic() < deadline, f"no refusal {'cleared' if cleared else 'reported'}"
        await asyncio.sleep(0.01)
    return reloader.report()["refused"]


def start(path: Path) -> tuple[ConfigReloader, Applied]:
    """A reloader of the config at `path` (not started) and what it applies."""
    applied = Applied()
    reloader = ConfigReloader(load_config(str(path)), applied)
    return reloader, applied
