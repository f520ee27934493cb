"""GC never holds pods up (#16): the stale pods' DELs run a few at a time, each under its own
pod's lock, so an ADD of a new pod issued during a GC completes while the GC's DELs are still
held; an ADD of a pod the GC is DELing waits for that DEL, never overlaps it. Real plugin
processes (tests/plugins/span_plugin.py records when each call starts and ends); no root."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from nri_cni.cni.config import parse_conflist
from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.pod.intents import IntendedNetwork, Intent
from nri_cni.pod.model import PodInfo
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan, pod_service

SPAN_PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "span_plugin.py"
PARALLEL = 4
STALE = [f"stale-{i:02d}" for i in range(12)]
LEFTOVER = "leftover"  # an ADD whose rollback failed: its intent record waits for GC


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.log = tmp / "spans.log"
        self.hold = tmp / "hold"
        self.hold.mkdir()
        self.netns_dir = tmp / "netns"
        self.netns_dir.mkdir()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        plugin = bin_dir / "span"
        plugin.write_text(f"#!{os.path.realpath(sys.executable)} -IS\n" + SPAN_PLUGIN.read_text())
        plugin.chmod(0o755)
        (tmp / "_finalize.d").mkdir()
        self.conflist = {
            "cniVersion": "1.1.0",
            "name": "podnet",
            "plugins": [
                {
                    "type": "span",
                    "log": str(self.log),
                    "hold": {"dir": str(self.hold), "commands": ["DEL"], "timeout": 60},
                }
            ],
        }
        doc = {
            "mode": "shim",
            "state_dir": str(tmp / "state"),
            "nri": {"socket": str(tmp / "nri.sock")},
            "daemon": {"socket": str(tmp / "daemon.sock")},
            "cni": {
                "bin_dirs": [str(bin_dir)],
                "cache_dir": str(tmp / "cache"),
                "finalize_dir": str(tmp / "_finalize.d"),
            },
            "networks": [{"name": "podnet", "default": True, "conflist": self.conflist}],
            "gc": {"interval": 0, "parallel": PARALLEL},
            "status": {"interval": 0},
            "files": {"trust": "warn"},  # the test's tmp dir, whoever runs it
        }
        cfg = parse_config(doc, str(tmp / "config.yaml"))
        cni = CNIRuntime(
            list(cfg.cni.bin_dirs), cfg.cni.cache_dir, executor=PluginExecutor(trust_files=cfg.trust_files)
        )
        self.service = pod_service(cfg, pod_plan(cfg, cni), mode=mode_for(cfg))

    def pod(self, pod_id: str) -> PodInfo:
        netns = self.netns_dir / pod_id  # a file standing for the netns: its path is all GC reads
        netns.touch()
        return PodInfo(pod_id, name=pod_id, namespace="default", netns=str(netns))

    def events(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def started(self, command: str) -> list[str]:
        return [e["container_id"] for e in self.events() if e["command"] == command and e["phase"] == "start"]


async def _until(check, what: str) -> None:
    """Waits for something the test caused (a guard against hanging, never a measurement)."""
    for _ in range(6000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _overlaps(events: list[dict]) -> list[str]:
    """Calls for one container id that ran at the same time (by the order of the log)."""
    running: dict[str, str] = {}
    found = []
    for e in events:
        cid, call = e["container_id"], f"{e['command']}/{e['container_id']}"
        if not cid:  # the GC verb: no container
            continue
        if e["phase"] == "start":
            if cid in running:
                found.append(f"{call} started while {running[cid]} ran")
            running[cid] = call
        else:
            running.pop(cid, None)
    return found


def _most_at_once(events: list[dict], command: str) -> int:
    now = most = 0
    for e in events:
        if e["command"] == command:
            now += 1 if e["phase"] == "start" else -1
            most = max(most, now)
    return most


def test_an_add_during_gc_of_many_stale_pods_completes_first_and_never_meets_gc_on_one_pod(tmp_path):
    world = World(tmp_path)
    service = world.service

    async def scenario() -> None:
        for pod_id in STALE:
            await service.verbs.attach(world.pod(pod_id))
            os.unlink(world.netns_dir / pod_id)  # the runtime removed its netns: garbage
        config = parse_conflist(world.conflist).bytes
        service.plan.intents.write(
            Intent(LEFTOVER, "", [IntendedNetwork("podnet", "eth0", config)], rollback_error="earlier")
        )
        service.roster.listed([])  # the runtime's (empty) pod list: GC may run
        setup = len(world.events())
        gc = asyncio.create_task(service.timers.gc(reason="test"))
        try:
            await _until(lambda: world.started("DEL"), "GC's first DEL")
            fresh = asyncio.create_task(service.verbs.attach(world.pod("fresh")))
            # Every DEL of the GC is held until the test releases it: the ADD has nothing but
            # its own pod to wait for, so it finishes first (before, it waited for the GC).
            done, _ = await asyncio.wait({fresh, gc}, return_when=asyncio.FIRST_COMPLETED)
            assert fresh in done and not gc.done(), "the ADD waited for the GC"
            assert [a.network for a in fresh.result().attachments] == ["podnet"]
            # the GC's slots fill up; then an ADD of a pod the GC is DELing right now
            await _until(lambda: len(world.started("DEL")) == PARALLEL, f"{PARALLEL} DELs at once")
            held = [p for p in world.started("DEL") if p in STALE][0]
            again = asyncio.create_task(service.verbs.attach(world.pod(held)))
        finally:
            (world.hold / "release").touch()
        report = await gc
        await again

        assert report["errors"] == []
        assert report["rolledBack"] == [LEFTOVER]
        assert sorted(report["deleted"]) == [f"podnet/{p}/eth0" for p in STALE]
        events = world.events()
        assert _overlaps(events) == []
        assert _most_at_once(events, "DEL") == PARALLEL  # concurrent, and bounded
        # the pod attached again after its DEL (it waited for its own pod only), then the GC
        # verb ran with it as a valid attachment
        calls = [(e["command"], e["container_id"]) for e in events[setup:] if e["phase"] == "start"]
        assert calls.index(("ADD", held)) > calls.index(("DEL", held))
        assert calls[-1] == ("GC", "")
        assert {e.container_id for e in service.view.attachments()} == {"fresh", held}
        # both attached during the GC and not yet listed by the runtime: valid for the next GC
        assert {"fresh", held} <= service.roster.valid_pod_ids(())
        assert len(service.locks) == 0

    asyncio.run(scenario())


def test_gc_locks_are_not_operations_and_gc_starts_no_plugin_beside_an_operation():
    from nri_cni.pod.locks import PodLocks

    async def scenario() -> None:
        locks = PodLocks()
        release = asyncio.Event()
        running: list[str] = []

        async def gc_plugin(name: str) -> None:
            async with locks.gc_slot(3):
                running.append(name)
                await release.wait()

        async with locks.pod("stale", gc=True):
            assert locks.pod_ids() == set() and locks.busy("stale")  # GC's own lock: no operation
            waiter = asyncio.create_task(_hold(locks, "stale"))
            await _settle()
            assert locks.pod_ids() == {"stale"}  # an ADD waiting for it is one
        await waiter

        async with locks.pod("live"):  # an operation in flight: GC starts no plugin
            first = [asyncio.create_task(gc_plugin(f"p{i}")) for i in range(3)]
            await _settle()
            assert running == []
        await _settle()  # the operation is over: all three slots
        assert running == ["p0", "p1", "p2"]
        release.set()
        await asyncio.gather(*first)
        assert len(locks) == 0

    asyncio.run(scenario())


async def _hold(locks, pod_id: str) -> None:
    async with locks.pod(pod_id):
        pass


async def _settle() -> None:
    """Lets every task that can run do so (no clock involved)."""
    for _ in range(10):
        await asyncio.sleep(0)
