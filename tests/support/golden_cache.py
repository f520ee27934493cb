"""libcni's cache file for one attachment, as real libcni wrote it, and the entry it holds: the
byte-for-byte reference of nri-cni's result cache."""

from __future__ import annotations

from pathlib import Path

from nri_cni.cni.cache import CacheEntry

# written by real libcni (golden/make_cache.py; tests/integration/cni/test_libcni_oracle.py checks it)
GOLDEN = (
    Path(__file__).resolve().parents[1] / "unit" / "cni" / "golden" / "libcni-cache-v1.json"
).read_bytes()
GOLDEN_CONFIG = b'{"cniVersion":"1.0.0","name":"nct-golden","plugins":[{"type":"fake-a"},{"type":"fake-b"}]}'


def golden_entry() -> CacheEntry:
    """The entry whose libcni cache file is GOLDEN."""
    return CacheEntry(
        container_id="c0ffee",
        ifname="eth0",
        network_name="nct-golden",
        config=GOLDEN_CONFIG,
        netns="/var/run/netns/nct-golden",
        cni_args=[("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "web-0")],
        capability_args={
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "io.kubernetes.cri.pod-annotations": {"note": "a<b & c>d"},
        },
        result={
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/nct-golden"}
            ],
            "ips": [{"interface": 0, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    )
