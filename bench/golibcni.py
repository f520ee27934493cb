"""The libcni anchor: bench/libcni-driver (Go, libcni 1.3.0 from Debian) built at bench time by
bench/go-toolchain.sh, driven over its stdin/stdout (JSON lines, one answer per request).

`build()` returns the driver's path, or raises NoGo with the reason (no Go in the archive, no
network, a build error): the caller then says so and compares with the exec floor instead.
Times are the driver's own (taken around the libcni call in Go), in ms.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEPS = Path(os.environ.get("NRI_CNI_DEPS", "/opt/nri-cni-deps"))
PREFIX = Path(os.environ.get("NRI_CNI_BENCH_GO", str(DEPS / "bench-go")))


class NoGo(Exception):
    """libcni's driver cannot be built here; the message says why."""


_built: str | None = None


def build() -> str:
    """The driver's path (built once per process; go-toolchain.sh itself reuses what it has)."""
    global _built
    if _built:
        return _built
    try:
        proc = subprocess.run(
            ["bash", str(HERE / "go-toolchain.sh")], capture_output=True, text=True, timeout=900
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoGo(f"go-toolchain.sh: {exc}") from exc
    if proc.returncode != 0:
        raise NoGo(f"go-toolchain.sh exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    path = proc.stdout.strip().splitlines()[-1]
    if not os.access(path, os.X_OK):
        raise NoGo(f"no driver at {path!r}")
    _built = path
    return path


def versions() -> str:
    """The Debian packages the driver was built from ("golang-1.27-go 1.27.3-1, ...")."""
    try:
        return ", ".join((PREFIX / "versions.txt").read_text().split("\n")[:-1])
    except OSError:
        return "?"


class LibcniDriver:
    """One driver process with a cache dir of its own."""

    def __init__(self, path: str, bin_dirs: list[str], cache_dir: str) -> None:
        self.proc = subprocess.Popen(
            [path, "-path", ":".join(bin_dirs), "-cache-dir", cache_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def _ask(self, req: dict) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req, separators=(",", ":")) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"libcni-driver exited ({self.proc.poll()})")
        ans = json.loads(line)
        if not ans["ok"]:
            raise RuntimeError(f"libcni {req['op']}: {ans['error']}")
        return ans.get("ns", 0) / 1e6

    def load(self, name: str, conflist: dict) -> None:
        self._ask({"op": "load", "list": name, "conflist": conflist})

    def _rt(self, op: str, name: str, cid: str, netns: str, ifname: str, args, caps) -> dict:
        return {
            "op": op,
            "list": name,
            "containerID": cid,
            "netns": netns,
            "ifname": ifname,
            "args": [list(a) for a in args],
            "caps": caps or {},
        }

    def add(self, name: str, cid: str, netns: str, ifname: str, args=(), caps=None) -> float:
        return self._ask(self._rt("add", name, cid, netns, ifname, args, caps))

    def delete(self, name: str, cid: str, netns: str, ifname: str, args=(), caps=None) -> float:
        return self._ask(self._rt("del", name, cid, netns, ifname, args, caps))

    def gc(self, name: str, valid: list[tuple[str, str]]) -> float:
        """GCNetworkList with these (containerID, ifname) attachments valid."""
        return self._ask(
            {"op": "gc", "list": name, "valid": [{"containerID": c, "ifname": i} for c, i in valid]}
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
