"""The call logs the test plugins write: one JSON object per line, appended per exec."""
from __future__ import annotations

import json
from pathlib import Path


def read_json_lines(path: Path) -> list[dict]:
    """Every logged call in order; none yet when the file does not exist."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
