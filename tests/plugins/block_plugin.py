# A CNI plugin that stops in the middle of a call until the test lets it go: fault injection from
# outside the product. While it blocks, a test can kill nri-cni (or the runtime) by PID, stop
# containerd, restart things, and then release the plugin or kill it too.
#
# Installed with a `#!<python> -IS` line (standard library only), like fake_plugin.py, by
# tests/support/bin_dir.py's `install_test_plugin`. The same file, imported, gives the test side:
# `BlockControl`.
#
# Config key "block" (in the plugin's own config in the conflist):
#   "dir"       a directory of the test's (required)
#   "commands"  the CNI commands that block (default: every command but VERSION)
#   "then"      after the release: "pass" (default) or "fail" (a CNI error, code 11)
#   "timeout"   seconds it waits at most (default 120), then fails with code 11: a test that
#               died never leaves a plugin behind for long
#   "armed"     a file: the plugin blocks only while that file exists (default: always), so one
#               daemon config serves the calls before the fault, the fault, and the restart
# A blocking call removes what an earlier call of its name left (.release, .done), writes
# <dir>/<COMMAND>.<CNI_CONTAINERID or ->.<CNI_IFNAME or ->.pid (JSON:
# pid, ppid, command, container id, ifname; renamed into place, so it is whole once seen), then
# polls every 10 ms for <dir>/release-all or <that name>.release, then writes <that name>.done.
# "pass": ADD prints its prevResult (or an empty result), every other command prints nothing.
# VERSION never blocks and answers every version.
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
POLL = 0.01


def _base(block_dir: str, command: str, container_id: str, ifname: str) -> str:
    return os.path.join(block_dir, f"{command}.{container_id or '-'}.{ifname or '-'}")


def _print_error(conf: dict, msg: str) -> int:
    sys.stdout.write(json.dumps({"cniVersion": conf.get("cniVersion", "1.1.0"), "code": 11, "msg": msg}))
    return 1


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    raw = sys.stdin.buffer.read()
    conf = json.loads(raw) if raw.strip() else {}
    if command == "VERSION":
        sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": VERSIONS}))
        return 0
    block = conf.get("block") or {}
    commands = block.get("commands")
    armed = not block.get("armed") or os.path.exists(block["armed"])
    if block.get("dir") and armed and (commands is None or command in commands):
        base = _base(
            block["dir"], command, os.environ.get("CNI_CONTAINERID", ""), os.environ.get("CNI_IFNAME", "")
        )
        info = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "command": command,
            "container_id": os.environ.get("CNI_CONTAINERID", ""),
            "ifname": os.environ.get("CNI_IFNAME", ""),
        }
        for stale in (".release", ".done"):  # of an earlier call of the same command and pod
            try:
                os.unlink(base + stale)
            except FileNotFoundError:
                pass
        tmp = f"{base}.pid.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(info))
        os.rename(tmp, base + ".pid")
        deadline = time.monotonic() + float(block.get("timeout", 120))
        release_all = os.path.join(block["dir"], "release-all")
        while not (os.path.exists(release_all) or os.path.exists(base + ".release")):
            if time.monotonic() > deadline:
                return _print_error(conf, f"block plugin: {command} never released")
            time.sleep(POLL)
        with open(base + ".done", "w") as f:
            f.write(str(os.getpid()))
        if block.get("then", "pass") == "fail":
            return _print_error(conf, f"block plugin: {command} released to fail")
    if command == "ADD":
        sys.stdout.write(
            json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion", "1.1.0")})
        )
    return 0


# ---- the test side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Blocked:
    pid: int
    ppid: int  # who ran it: nri-cni's daemon (or the runtime, for containerd's own CNI)
    command: str
    container_id: str
    ifname: str
    base: str

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True


class BlockControl:
    """The test's handle on one block dir."""

    def __init__(self, block_dir: str | os.PathLike) -> None:
        self.dir = Path(block_dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def config(self, *, armed: bool = False, **kw) -> dict:
        """The "block" value for a plugin's config; `armed`: it blocks only between arm() and
        disarm()."""
        return {"dir": str(self.dir), **({"armed": str(self.dir / "armed")} if armed else {}), **kw}

    def arm(self) -> None:
        (self.dir / "armed").touch()

    def disarm(self) -> None:
        (self.dir / "armed").unlink(missing_ok=True)

    def blocked(self) -> list[Blocked]:
        out = []
        for p in sorted(self.dir.glob("*.pid")):
            info = json.loads(p.read_text())
            out.append(
                Blocked(
                    info["pid"],
                    info["ppid"],
                    info["command"],
                    info["container_id"],
                    info["ifname"],
                    str(p)[: -len(".pid")],
                )
            )
        return out

    def wait_blocked(
        self, command: str, container_id: str | None = None, *, timeout: float = 60.0
    ) -> Blocked:
        """The first call of `command` (for `container_id`) that is blocked now (not one that was
        released or killed before); fails after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            for b in self.blocked():
                if b.command != command or (container_id is not None and b.container_id != container_id):
                    continue
                if b.alive() and not self.done(b) and not self.released(b):
                    return b
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {command} blocked in {self.dir} after {timeout} s: {self.blocked()}")
            time.sleep(POLL)

    def release(self, blocked: Blocked) -> None:
        Path(blocked.base + ".release").touch()

    def release_all(self) -> None:
        (self.dir / "release-all").touch()

    def released(self, blocked: Blocked) -> bool:
        return os.path.exists(blocked.base + ".release") or (self.dir / "release-all").exists()

    def done(self, blocked: Blocked) -> bool:
        return os.path.exists(blocked.base + ".done")


if __name__ == "__main__":
    sys.exit(main())
