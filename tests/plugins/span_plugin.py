# A CNI plugin that records when each call starts and ends, for tests about what runs at the same
# time. Installed with a `#!<python> -IS` line (standard library only), like fake_plugin.py.
#
# Every call but VERSION appends two JSON lines to the file named by the config key "log":
#   {"phase": "start" | "end", "command", "container_id", "ifname", "pid"}
# (appends of one short line with O_APPEND land whole and in the order they happened).
# Config key "hold": {"dir", "commands", "timeout"}: a call of one of `commands` waits between
# its two lines until <dir>/release exists (polled every 10 ms), at most `timeout` seconds
# (default 60), then creates the release file itself (every other held call goes on) and fails
# with CNI code 11: a test that lost its way ends soon and never leaves a plugin behind.
# ADD prints its prevResult plus an interface "span"; every other command prints nothing.
from __future__ import annotations

import json
import os
import sys
import time

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def _record(path: str, phase: str, command: str) -> None:
    line = {
        "phase": phase,
        "command": command,
        "container_id": os.environ.get("CNI_CONTAINERID", ""),
        "ifname": os.environ.get("CNI_IFNAME", ""),
        "pid": os.getpid(),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, json.dumps(line).encode() + b"\n")
    finally:
        os.close(fd)


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    raw = sys.stdin.buffer.read()
    conf = json.loads(raw) if raw.strip() else {}
    if command == "VERSION":
        sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": VERSIONS}))
        return 0
    _record(conf["log"], "start", command)
    hold = conf.get("hold") or {}
    if command in hold.get("commands", ()):
        release = os.path.join(hold["dir"], "release")
        deadline = time.monotonic() + float(hold.get("timeout", 60))
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                open(release, "a").close()
                sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "code": 11, "msg": "never released"}))
                return 1
            time.sleep(0.01)
    _record(conf["log"], "end", command)
    if command == "ADD":
        result = conf.get("prevResult") or {"cniVersion": conf.get("cniVersion", "1.1.0")}
        result.setdefault("interfaces", []).append({"name": "span"})
        sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
