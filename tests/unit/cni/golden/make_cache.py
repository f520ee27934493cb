"""Writes libcni-cache-v1.json, the cache entry the unit tests read and write byte for byte
(tests/unit/cni/test_cni_cache.py), with real libcni 1.3.0 (tests/support/libcni.py): libcni
runs the golden network list (fake-a, then fake-b printing the golden result) and its cache
file is copied here. --check compares instead of writing (tests/integration/cni/
test_libcni_oracle.py runs it), exit 1 on a difference.

    .venv/bin/python tests/unit/cni/golden/make_cache.py [--check]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))  # the repo: tests.support, bench

from bench import golibcni  # noqa: E402
from tests.support.libcni import Libcni  # noqa: E402

GOLDEN = HERE / "libcni-cache-v1.json"
CONFIG = b'{"cniVersion":"1.0.0","name":"nct-golden","plugins":[{"type":"fake-a"},{"type":"fake-b"}]}'
RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/nct-golden"}],
    "ips": [{"address": "10.244.0.5/24", "gateway": "10.244.0.1", "interface": 0}],
    "routes": [{"dst": "0.0.0.0/0"}],
}
ADD = {
    "list": "nct-golden",
    "containerID": "c0ffee",
    "netns": "/var/run/netns/nct-golden",
    "ifname": "eth0",
    "args": [["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "web-0"]],
    "caps": {
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "io.kubernetes.cri.pod-annotations": {"note": "a<b & c>d"},
    },
}


def libcni_entry(driver: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        bin_dir.mkdir()
        for name, output in (("fake-a", {"cniVersion": "1.0.0"}), ("fake-b", RESULT)):
            (bin_dir / f"{name}.out").write_text(json.dumps(output))
            plugin = bin_dir / name
            plugin.write_text(f"#!/bin/sh\ncat '{bin_dir / name}.out'\n")
            plugin.chmod(0o755)
        libcni = Libcni(driver, [str(bin_dir)], str(Path(tmp) / "cache"))
        try:
            for answer in (libcni.load("nct-golden", CONFIG), libcni.request("add", **ADD)):
                if not answer["ok"]:
                    raise SystemExit(f"libcni: {answer['error']}")
        finally:
            libcni.close()
        return (Path(tmp) / "cache" / "results" / "nct-golden-c0ffee-eth0").read_bytes()


def main(argv: list[str]) -> int:
    entry = libcni_entry(golibcni.build())
    if "--check" in argv:
        if GOLDEN.read_bytes() != entry:
            print(f"{GOLDEN} differs from what libcni writes:\n{entry.decode()}", file=sys.stderr)
            return 1
        return 0
    GOLDEN.write_bytes(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
