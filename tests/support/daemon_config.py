"""nri-cni's config document for a test's or a benchmark's daemon (what parse_config reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def daemon_config(
    mode: str,
    networks: list[dict[str, Any]],
    *,
    nri_socket: str | Path,
    daemon_socket: str | Path,
    state_dir: str | Path,
    bin_dirs: list[str] | list[Path],
    cache_dir: str | Path,
    finalize_dir: str | Path,
    plugin_timeout: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Sockets, dirs and networks; `extra` adds (or replaces) top-level sections."""
    cni: dict[str, Any] = {
        "bin_dirs": [str(d) for d in bin_dirs],
        "cache_dir": str(cache_dir),
        "finalize_dir": str(finalize_dir),
    }
    if plugin_timeout is not None:
        cni["plugin_timeout"] = plugin_timeout
    return {
        "mode": mode,
        "nri": {"socket": str(nri_socket)},
        "daemon": {"socket": str(daemon_socket)},
        "state_dir": str(state_dir),
        "cni": cni,
        "networks": networks,
        **extra,
    }
