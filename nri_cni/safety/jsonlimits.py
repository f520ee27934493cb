"""JSON and YAML readers with limits, for every document that comes from outside the process.

Python's json and yaml parsers recurse once per nesting level: 5000 `[` raise RecursionError,
which no caller expects and which used to escape request handlers and kill the reload task. Here
a document is measured first without recursion (size, then nesting depth, in C-speed passes) and
refused with a ValueError (`JsonLimitError`) naming the limit; RecursionError never leaves.

YAML: aliases are refused outright (an alias bomb expands 600 bytes into gigabytes; nri-cni's
config never needs them) and nesting depth is bounded while composing.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

MAX_DEPTH = 64  # a CNI result or conflist nests about 6 levels
MAX_BYTES = 4 * 1024 * 1024  # the shim's stdin limit; plugin results and cache files are smaller
MAX_YAML_BYTES = 1024 * 1024

# A JSON string (escapes included); what is left after removing them is structure and scalars.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class JsonLimitError(ValueError):
    """A document over a size or depth limit (a ValueError, like a JSON syntax error)."""


def check_depth(data: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Raises JsonLimitError when the brackets of `data` (outside strings) nest deeper than
    `max_depth`. Each pass removes the innermost pairs, so it takes at most max_depth passes."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return  # cannot nest deeper than it has openings (a CNI result: about 10): no passes
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if re.search(rb"[\[{]{%d}" % (max_depth + 1), brackets):
        raise JsonLimitError(f"nested deeper than {max_depth} levels")
    for _ in range(max_depth):
        if not brackets:
            return
        shorter = _INNERMOST.sub(b"", brackets)
        if shorter == brackets:
            return  # unbalanced: the parser reports it as a syntax error
        brackets = shorter
    if brackets and _INNERMOST.search(brackets):
        raise JsonLimitError(f"nested deeper than {max_depth} levels")


def loads(data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with limits. Raises ValueError (JSONDecodeError, JsonLimitError) only."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JsonLimitError(f"{len(raw)} bytes, over the limit of {max_bytes}")
    check_depth(raw, max_depth)
    try:
        return json.loads(raw)
    except RecursionError:  # not reachable after check_depth; kept so it can never escape
        raise JsonLimitError(f"nested deeper than {max_depth} levels") from None


def yaml_load(text: str, *, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """yaml.safe_load without aliases and with a depth limit. Raises yaml.YAMLError (with a mark
    when known) for syntax errors and for these limits."""
    import yaml  # lazy: PyYAML (~15 ms) only where a config file is read

    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise yaml.YAMLError(f"the document is over the limit of {max_bytes} bytes")
    loader = _limited_loader()(text, max_depth)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise yaml.YAMLError(f"nested deeper than {max_depth} levels") from None
    finally:
        loader.dispose()


@functools.cache
def _limited_loader() -> type:
    """The loader class, made once (a class made per read is a reference cycle per read)."""
    import yaml  # lazy: as in yaml_load, PyYAML only where a config file is read

    class LimitedLoader(yaml.SafeLoader):
        def __init__(self, text: str, max_depth: int) -> None:
            super().__init__(text)
            self.max_depth = max_depth
            self.depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in nri-cni's config", event.start_mark
                )
            self.depth += 1
            try:
                if self.depth > self.max_depth:
                    event = self.peek_event()
                    raise yaml.composer.ComposerError(
                        None, None, f"nested deeper than {self.max_depth} levels", event.start_mark
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return LimitedLoader
