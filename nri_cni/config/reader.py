"""Walking the parsed YAML: every problem collected with its key path instead of stopping."""

from __future__ import annotations

import os
import re
from typing import Any

from nri_cni.config.model import _DURATION, _PLUGIN_IDX
from nri_cni.errors import ConfigError


class _Reader:
    """Walks the parsed YAML, collecting every error with its key path instead of stopping."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.errors: list[ConfigError] = []
        self.trust_files = True  # files.trust: enforce

    def fail(self, where: str, msg: str) -> None:
        self.errors.append(ConfigError(msg, location=f"{self.path}: {where}" if where else self.path))

    def section(self, data: dict, key: str, where: str = "") -> dict:
        value = data.get(key, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(_join(where, key), f"must be a mapping, not {_kind(value)}")
            return {}
        return value

    def unknown_keys(self, data: dict, known: set[str], where: str) -> None:
        for key in data:
            if key not in known:
                self.fail(_join(where, str(key)), f"unknown key (known: {', '.join(sorted(known))})")

    def string(
        self,
        data: dict,
        key: str,
        default: str,
        where: str,
        *,
        choices=None,
        pattern: re.Pattern | None = None,
        path: bool = False,
    ) -> str:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if isinstance(value, int) and not isinstance(value, bool) and pattern is _PLUGIN_IDX:
            value = f"{value:02d}"  # YAML reads `10` as a number
        if not isinstance(value, str):
            self.fail(_join(where, key), f"must be a string, not {_kind(value)}")
            return default
        if choices and value not in choices:
            self.fail(_join(where, key), f"{value!r} is not one of {', '.join(choices)}")
            return default
        if pattern and not pattern.match(value):
            self.fail(_join(where, key), f"{value!r} is not valid (must match {pattern.pattern})")
            return default
        if path and not os.path.isabs(value):
            self.fail(_join(where, key), f"{value!r} must be an absolute path")
            return default
        return value

    def boolean(self, data: dict, key: str, default: bool, where: str) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.fail(_join(where, key), f"must be true or false, not {value!r}")
            return default
        return value

    def duration(self, data: dict, key: str, default: float, where: str) -> float:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and (m := _DURATION.match(value)):
            scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
            seconds = float(m.group(1)) * scale
        else:
            self.fail(_join(where, key), f"{value!r} is not a duration (e.g. 30s, 500ms, 10m)")
            return default
        if seconds < 0:
            self.fail(_join(where, key), "must not be negative")
            return default
        return seconds

    def integer(
        self, data: dict, key: str, default: int, where: str, *, low: int = 0, high: int = 1 << 31
    ) -> int:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(_join(where, key), f"must be an integer from {low} to {high}, not {value!r}")
            return default
        return value

    def id_list(self, data: dict, key: str, default: tuple[int, ...], where: str) -> tuple[int, ...]:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32 for v in value
        ):
            self.fail(_join(where, key), "must be a list of numeric ids")
            return default
        return tuple(value)

    def string_list(
        self, data: dict, key: str, default: tuple[str, ...], where: str, *, path: bool = False
    ) -> tuple[str, ...]:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(_join(where, key), "must be a list of strings")
            return default
        if path:
            for i, item in enumerate(value):
                if not os.path.isabs(item):
                    self.fail(f"{_join(where, key)}[{i}]", f"{item!r} must be an absolute path")
        return tuple(value)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
