"""The valid list a GC hands to each network's plugins (nri_cni/pod/upkeep.py): every attachment
still cached after the stale pods went, each with its own ifname, per network."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.detach import Detacher
from nri_cni.pod.intents import IntentStore
from nri_cni.pod.oprecord import NoSink, OperationLog
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.upkeep import Upkeep

KEPT, STALE = "a" * 64, "b" * 64


def conflist(name: str) -> dict:
    return {"cniVersion": "1.1.0", "name": name, "plugins": [{"type": f"gc-{name}"}]}


@pytest.mark.parametrize("ifname", ["eth0", "net1"])
def test_the_gc_verb_gets_each_kept_attachment_with_its_ifname(tmp_path, ifname):
    """Control case: the same cache with the kept pod's ifname changed (eth0, net1) changes the
    list the same way; the stale pod is DELed and left out of it; the other network's list
    holds only its own attachment."""
    cfg = parse_config(
        {
            "mode": "native",
            "state_dir": str(tmp_path / "state"),
            "cni": {"cache_dir": str(tmp_path / "cache"), "bin_dirs": [str(tmp_path / "bin")]},
            "networks": [
                {"name": "net-a", "default": True, "conflist": conflist("net-a")},
                {"name": "net-b", "conflist": conflist("net-b")},
            ],
        }
    )
    fake = FakeExecutor({"gc-net-a": {}, "gc-net-b": {}})
    cni = CNIRuntime([str(tmp_path / "bin")], str(tmp_path / "cache"), executor=fake)
    for pod_id, net, name in ((KEPT, "net-a", ifname), (STALE, "net-a", "eth0"), (KEPT, "net-b", "net2")):
        cni.cache.write(
            CacheEntry(
                container_id=pod_id,
                ifname=name,
                network_name=net,
                config=json.dumps(conflist(net)).encode(),
                netns=str(tmp_path),  # a path that exists: only the valid set decides
            )
        )
    intents = IntentStore(str(tmp_path / "state"))
    rollback = Rollback(cni, intents)
    detacher = Detacher(cni, intents=intents, rollback=rollback)
    upkeep = Upkeep(cfg, cni, rollback=rollback, detacher=detacher, oplog=OperationLog(NoSink()))

    report = asyncio.run(upkeep.collect_garbage({KEPT}))

    assert report["errors"] == [] and report["deleted"] == [f"net-a/{STALE}/eth0"]
    gc = {c.plugin: json.loads(c.stdin) for c in fake.calls if c.command == "GC"}
    assert gc["gc-net-a"]["cni.dev/valid-attachments"] == [{"containerID": KEPT, "ifname": ifname}]
    assert gc["gc-net-b"]["cni.dev/valid-attachments"] == [{"containerID": KEPT, "ifname": "net2"}]
    left = sorted((e.network_name, e.container_id, e.ifname) for e in cni.cache.entries())
    assert left == [("net-a", KEPT, ifname), ("net-b", KEPT, "net2")]
