"""Real libcni 1.3.0 as a test oracle: bench/libcni-driver (Go, built from Debian's packages by
bench/go-toolchain.sh; .ci/install-deps builds it once into $NRI_CNI_DEPS/bench-go), driven
over its stdin/stdout, one JSON line per request.

`driver_path()` FAILS the calling test when the driver cannot be built, unless the caller opted
out with NRI_CNI_NO_LIBCNI=1: then the test is skipped with a reason that names what was left
out (pytest -ra prints it)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from bench import golibcni

OPT_OUT = "NRI_CNI_NO_LIBCNI"


def driver_path(what: str) -> str:
    """The driver's path; `what`: what the calling test checks, for the opt-out's message."""
    try:
        return golibcni.build()
    except golibcni.NoGo as exc:
        if os.environ.get(OPT_OUT) == "1":
            pytest.skip(f"{OPT_OUT}=1: left out {what} against real libcni ({exc})")
        pytest.fail(f"libcni's driver cannot be built ({exc}); {OPT_OUT}=1 leaves out {what}")


class Libcni:
    """One driver process with its own cache dir and plugin dirs."""

    def __init__(self, path: str, bin_dirs: list[str], cache_dir: str) -> None:
        self.proc = subprocess.Popen(
            [path, "-path", ":".join(bin_dirs), "-cache-dir", cache_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def ask(self, line: bytes) -> dict[str, Any]:
        """Sends one request line (bytes, so that a conflist goes as its exact bytes)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert b"\n" not in line
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"libcni-driver exited ({self.proc.wait()})")
        return json.loads(answer)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.ask(json.dumps({"op": op, **fields}, ensure_ascii=False).encode())

    def load(self, name: str, conflist: bytes) -> dict[str, Any]:
        """Loads a conflist given as its file's bytes (one line)."""
        head = json.dumps({"op": "load", "list": name}).encode()[:-1]
        return self.ask(head + b',"conflist":' + conflist + b"}")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()
