"""The call logs the test plugins write: one JSON object per line, appended per exec."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_lines(path: Path) -> list:
    """Every logged call in order; none yet when the file does not exist. A plugin may be
    appending right now (a reader can see part of a write to a regular file): a last line
    without its newline is not complete yet and is left out."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]
