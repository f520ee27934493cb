# A CNI plugin that decorates its prevResult's in-pod interfaces, as a vhost-user or SR-IOV
# plugin would: ADD prints the prevResult with the config's "metadata" map, "socketPath" and
# "pciID" set on each interface that has a sandbox; VERSION prints every version; anything
# else prints nothing. Installed with a `#!<python> -IS` line (tests/e2e/test_containers.py).
import json
import os
import sys

command = os.environ.get("CNI_COMMAND", "")
conf = json.loads(sys.stdin.buffer.read() or b"{}")
if command == "ADD":
    result = conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}
    for iface in result.get("interfaces", []):
        if iface.get("sandbox"):
            for key in ("metadata", "socketPath", "pciID"):
                if key in conf:
                    iface[key] = conf[key]
    result["cniVersion"] = conf.get("cniVersion")
    sys.stdout.write(json.dumps(result))
elif command == "VERSION":
    sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}))
