"""What a network list says about the INIT / DEINIT verbs, and what a generation is.

A plugin takes part in the network lifecycle only if its own config object says so, with
`"cni.dev/lifecycle": ["init", "deinit"]` (either verb alone is fine). The CNI spec has no such
verbs: a plugin that never heard of them answers INIT with "unknown CNI_COMMAND" at best, so
nri-cni never guesses. A generation is one exact configuration of a network: the hash of the
config bytes that ADD caches, so that a cache entry names the generation it was made with.
"""

from __future__ import annotations

import hashlib
from typing import Any

from nri_cni.cni.config import NetworkConfigList, PluginConf
from nri_cni.errors import ConfigError

LIFECYCLE_KEY = "cni.dev/lifecycle"
INIT = "INIT"
DEINIT = "DEINIT"
_VERBS = {"init": INIT, "deinit": DEINIT}
GENERATION_CHARS = 16  # 64 bits of sha256: names a file, never collides among one network's configs


def generation_id(config_bytes: bytes) -> str:
    return hashlib.sha256(config_bytes).hexdigest()[:GENERATION_CHARS]


def declared_verbs(conf: Any, where: str = "") -> frozenset[str]:
    """The verbs ("INIT", "DEINIT") a plugin config declares; raises ConfigError on a bad key."""
    if not isinstance(conf, dict) or LIFECYCLE_KEY not in conf:
        return frozenset()
    value = conf[LIFECYCLE_KEY]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{LIFECYCLE_KEY!r} must be a list of verbs ("init", "deinit")', location=where)
    unknown = [v for v in value if v.lower() not in _VERBS]
    if unknown:
        raise ConfigError(
            f"{LIFECYCLE_KEY!r}: unknown verb(s) {', '.join(map(repr, unknown))} (known: init, deinit)",
            location=where,
        )
    return frozenset(_VERBS[v.lower()] for v in value)


def validate_list(net: NetworkConfigList, where: str = "") -> None:
    """Every plugin's lifecycle key (finalize plugins never get these verbs: refused there)."""
    for i, plugin in enumerate(net.plugins):
        declared_verbs(plugin.conf, f"{where}: plugins[{i}]" if where else f"plugins[{i}]")
    for i, plugin in enumerate(net.finalize_plugins):
        if LIFECYCLE_KEY in plugin.conf:
            raise ConfigError(
                f"{LIFECYCLE_KEY!r} is for plugins of the chain, not finalize_plugins",
                location=f"{where}: finalize_plugins[{i}]",
            )


def plugins_for(net: NetworkConfigList, verb: str) -> tuple[tuple[int, PluginConf], ...]:
    """(index, plugin) of the chain's plugins that declare `verb`, in the order it runs them:
    INIT in list order (like ADD), DEINIT in reverse (like DEL)."""
    chosen = tuple((i, p) for i, p in enumerate(net.plugins) if verb in declared_verbs(p.conf))
    return tuple(reversed(chosen)) if verb == DEINIT else chosen


def is_managed(net: NetworkConfigList) -> bool:
    """True when some plugin of the list takes part in the lifecycle."""
    return any(declared_verbs(p.conf) for p in net.plugins)
