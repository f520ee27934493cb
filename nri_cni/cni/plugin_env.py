"""A plugin's environment: CNI_ARGS from validated pairs, and the six CNI variables."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from nri_cni.errors import ConfigError

_ARG_KEY_RE = re.compile(r"[A-Za-z0-9_]+")


def cni_args(pairs: Sequence[tuple[str, str]]) -> str:
    """CNI_ARGS with IgnoreUnknown=1 first. A key or value that could smuggle in another key
    (a pod name or annotation is user input) is refused rather than escaped: CNI_ARGS has no
    escaping, and a plugin would read `K8S_POD_NAME=a;IP=10.0.0.1` as two keys."""
    parts = [] if any(k == "IgnoreUnknown" for k, _ in pairs) else ["IgnoreUnknown=1"]
    for key, value in pairs:
        if not isinstance(key, str) or not _ARG_KEY_RE.fullmatch(key):
            raise ConfigError(f"invalid CNI_ARGS key {key!r}", location="CNI_ARGS")
        if not isinstance(value, str) or any(c in value for c in ";=\0"):
            raise ConfigError(
                f"CNI_ARGS value for {key} must not contain ';', '=' or NUL: {value!r}", location="CNI_ARGS"
            )
        parts.append(f"{key}={value}")
    return ";".join(parts)


def cni_env(
    base: Mapping[str, str],
    command: str,
    *,
    container_id: str = "",
    netns: str = "",
    ifname: str = "",
    args: str = "",
    path: str = "",
) -> dict[str, str]:
    """The one place a plugin's environment is made: `base`, then all six CNI variables set
    after it (libcni sets empty strings for what a verb does not use)."""
    env = dict(base)
    env.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_ARGS=args,
        CNI_PATH=path,
    )
    return env
