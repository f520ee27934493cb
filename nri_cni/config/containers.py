"""The `containers:` section and each network's `containers:` key (docs/containers.md)."""

from __future__ import annotations

import os

from nri_cni.config.model import ContainerSettings, NetworkContainers
from nri_cni.config.reader import _join, _Reader

_SWITCHES = ("annotations", "file", "sockets")


def parse_containers(r: _Reader, data: dict) -> ContainerSettings:
    """The top-level `containers:` section."""
    section = r.section(data, "containers")
    r.unknown_keys(section, {*_SWITCHES, "socket_dirs"}, "containers")
    dirs = r.string_list(section, "socket_dirs", (), "containers", path=True)
    for i, directory in enumerate(dirs):
        if os.path.isabs(directory) and os.path.normpath(directory) in ("/", "//"):
            r.fail(f"containers.socket_dirs[{i}]", "'/' would let any socket path in")
        elif os.path.isabs(directory) and ".." in directory.split("/"):
            r.fail(f"containers.socket_dirs[{i}]", f"{directory!r} must not contain '..'")
    return ContainerSettings(
        annotations=r.boolean(section, "annotations", True, "containers"),
        file=r.boolean(section, "file", True, "containers"),
        sockets=r.boolean(section, "sockets", True, "containers"),
        socket_dirs=tuple(os.path.normpath(d) for d in dirs),
    )


def parse_network_containers(r: _Reader, item: dict, where: str) -> NetworkContainers:
    """`networks[i].containers`: this network's switches."""
    section = r.section(item, "containers", where)
    here = _join(where, "containers")
    r.unknown_keys(section, set(_SWITCHES), here)
    return NetworkContainers(
        annotations=r.boolean(section, "annotations", True, here),
        file=r.boolean(section, "file", True, here),
        sockets=r.boolean(section, "sockets", True, here),
    )
