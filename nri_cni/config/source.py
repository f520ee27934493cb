"""The config in force, held in one place.

Built once in the composition root and handed to every part that reads the config; a hot
reload replaces what it holds (`replace`), so no part keeps a copy that could go stale and no
part is changed after it is built. What a part derives from the config (the mode, the
`_finalize.d` plugins) is derived here, once per config: every reader gets the same object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nri_cni.config.model import Config

T = TypeVar("T")


class ConfigSource:
    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        self._derived: dict[str, Any] = {}

    @classmethod
    def of(cls, cfg: Config | ConfigSource) -> ConfigSource:
        """`cfg` itself when it is a source; else a source of its own (a part built alone)."""
        return cfg if isinstance(cfg, ConfigSource) else cls(cfg)

    @property
    def current(self) -> Config:
        return self._cfg

    def replace(self, cfg: Config) -> None:
        """A hot reload: every reader sees `cfg` from its next read on."""
        self._cfg = cfg
        self._derived.clear()

    def derived(self, key: str, make: Callable[[Config], T]) -> T:
        """`make(current)`, made once per config and shared by every reader."""
        if key not in self._derived:
            self._derived[key] = make(self._cfg)
        value: T = self._derived[key]
        return value

    def seed(self, key: str, value: Any) -> None:
        """What `derived(key, ...)` returns for the current config (a part built with one)."""
        self._derived[key] = value
