# A CNI plugin that implements nri-cni's INIT / DEINIT contract (docs/lifecycle.md), for tests.
# Installed with a `#!<python> -IS` line, like fake_plugin.py: standard library only.
#
# Every call appends one JSON line to the file named by the config key "log":
#   {"command", "generation", "others": [generation ids], "tag", "bridge", "env": {CNI_*}, "t"}
# Config keys:
#   "bridge"     a host bridge: INIT creates it (marked with an ifalias), DEINIT deletes it unless
#                another live generation of the network names the same bridge; ADD fails when
#                the bridge is missing or unmarked (an ADD before INIT), DEINIT fails while the
#                bridge still has ports (a DEINIT before the last DEL)
#   "fail_init"  the first N INIT calls fail (counted in the file named by "counter")
#   "fail_deinit" the same for DEINIT
#   "init_sleep", "deinit_sleep"  seconds INIT / DEINIT take
#   "init_gate"  a path: INIT waits until it exists (at most 300 s, then fails)
#   "tag"        any value, echoed in the log (tells configurations apart)
#   "counter"    path prefix for the failure counters and the busy marker: INIT and DEINIT of
#                one network hold <counter>.busy.<network> (O_EXCL) and fail if another call
#                holds it (two lifecycle verbs of one network at once)
# In a chain it passes its prevResult through on ADD.
import json
import os
import subprocess
import sys
import time

MARK = "nri-cni-lifecycle-test"
command = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.buffer.read()
conf = json.loads(raw) if raw.strip() else {}
bridge = conf.get("bridge", "")


def log_call(**extra):
    path = conf.get("log")
    if not path:
        return
    line = {
        "command": command,
        "generation": conf.get("cni.dev/generation"),
        "others": [o["generation"] for o in conf.get("cni.dev/other-generations", [])],
        "tag": conf.get("tag"),
        "bridge": bridge,
        "name": conf.get("name"),
        "env": {k: v for k, v in os.environ.items() if k.startswith("CNI_")},
        "t": time.time(),
        **extra,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, json.dumps(line).encode() + b"\n")
    os.close(fd)


def fail(code, msg):
    sys.stdout.write(json.dumps({"cniVersion": conf.get("cniVersion", "1.1.0"), "code": code, "msg": msg}))
    sys.exit(1)


def failures_left(key):
    """True while the first N calls (config key `key`) are still to fail; counts this one."""
    limit = conf.get(key, 0)
    if not limit:
        return False
    counter = conf["counter"] + "." + key
    try:
        with open(counter) as f:
            done = int(f.read() or 0)
    except FileNotFoundError:
        done = 0
    if done >= limit:
        return False
    with open(counter, "w") as f:
        f.write(str(done + 1))
    return True


def sysfs(*parts):
    return os.path.join("/sys/class/net", bridge, *parts)


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def shares_bridge(other):
    return any(
        p.get("type") == conf.get("type") and p.get("bridge") == bridge
        for p in other["config"].get("plugins", [])
    )


def hold_network():
    """Fails the call if another INIT/DEINIT of this network is running right now."""
    if "counter" not in conf:
        return lambda: None
    path = f"{conf['counter']}.busy.{conf.get('name')}"
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        log_call(overlap=True)
        fail(11, f"another INIT/DEINIT of network {conf.get('name')} is running")
    return lambda: os.unlink(path)


if command in ("INIT", "DEINIT"):
    release = hold_network()
    import atexit

    atexit.register(release)  # also on sys.exit() from fail()

if command == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
elif command == "INIT":
    log_call()
    if conf.get("init_sleep"):
        time.sleep(conf["init_sleep"])
    if conf.get("init_gate"):
        gate_deadline = time.monotonic() + 300
        while not os.path.exists(conf["init_gate"]):
            if time.monotonic() > gate_deadline:
                fail(11, f"INIT's gate {conf['init_gate']} never opened")
            time.sleep(0.01)
    if failures_left("fail_init"):
        fail(11, f"INIT of the test plugin fails on purpose (bridge {bridge})")
    if bridge:
        if not os.path.exists(sysfs()):  # INIT may find it: a crash, or a sibling generation
            ip("link", "add", "name", bridge, "type", "bridge")
        ip("link", "set", "dev", bridge, "alias", MARK, "up")
elif command == "DEINIT":
    log_call()
    if conf.get("deinit_sleep"):
        time.sleep(conf["deinit_sleep"])
    if failures_left("fail_deinit"):
        fail(11, f"DEINIT of the test plugin fails on purpose (bridge {bridge})")
    if bridge and os.path.exists(sysfs()):
        if any(shares_bridge(o) for o in conf.get("cni.dev/other-generations", [])):
            log_call(kept=True)  # its ports may be the sibling's pods
        else:
            ports = os.listdir(sysfs("brif"))
            if ports:
                fail(11, f"bridge {bridge} still has ports {ports}: DEINIT before the last DEL")
            ip("link", "del", "dev", bridge)
elif command == "ADD":
    log_call()
    if bridge:
        try:
            with open(sysfs("ifalias")) as f:
                alias = f.read().strip()
        except FileNotFoundError:
            alias = None
        if alias != MARK:
            fail(11, f"bridge {bridge} was not prepared by INIT (ADD before INIT?)")
    print(json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}))
elif command in ("DEL", "CHECK", "GC", "STATUS"):
    log_call()
else:
    log_call()
    fail(4, f"unknown CNI_COMMAND: {command}")
