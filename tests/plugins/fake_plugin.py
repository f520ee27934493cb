# A scriptable CNI plugin for unit tests. The `fake_bin` fixture (tests/unit/cni/conftest.py)
# installs it with a `#!<python> -IS` line (one argument: Linux passes the rest of the line as one) under several names.
# `fake_plugin` in that conftest does the same in-process (tests/unit/cni/test_fake_plugin.py
# holds the two together): change both.
#
# Every call appends one JSON line to the file named by the config key "log" (or $FAKE_LOG):
#   {"type", "command", "env": {CNI_* and PATH}, "stdin": <the config it read>}
# What it does is chosen by the config key "fake": {"<COMMAND>": {...}} with, in order:
#   "stderr": text for stderr;  "sleep": seconds;  "print": raw text for stdout;
#   "result": an object printed as JSON;  "error": {code,msg,details} printed, exit 1;
#   "exit": the exit status (default 0).
# Without a "fake" entry: ADD prints its prevResult plus an interface named after its type
# (so chains show their order), VERSION prints every version, anything else prints nothing.
import json
import os
import sys
import time

command = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.buffer.read()
conf = json.loads(raw) if raw.strip() else {}
log = conf.get("log") or os.environ.get("FAKE_LOG")
if log:
    env = {k: v for k, v in os.environ.items() if k.startswith("CNI_") or k == "PATH"}
    line = json.dumps({"type": conf.get("type"), "command": command, "env": env, "stdin": conf})
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line.encode() + b"\n")
    os.close(fd)

act = conf.get("fake", {}).get(command)
if act is None:
    if command == "ADD":
        res = conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}
        res.setdefault("interfaces", []).append({"name": conf.get("type")})
        act = {"result": res}
    elif command == "VERSION":
        act = {
            "result": {
                "cniVersion": "1.1.0",
                "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
            }
        }
    else:
        act = {}
if "stderr" in act:
    sys.stderr.write(act["stderr"])
    sys.stderr.flush()
if "sleep" in act:
    time.sleep(act["sleep"])
if "print" in act:
    sys.stdout.write(act["print"])
if "result" in act:
    sys.stdout.write(json.dumps(act["result"]))
if "error" in act:
    sys.stdout.write(json.dumps(dict(act["error"], cniVersion=conf.get("cniVersion", "1.1.0"))))
    sys.exit(act.get("exit", 1))
sys.exit(act.get("exit", 0))
