"""GC yields to pods (nri_cni/pod/upkeep.py through PodLocks.gc_slot): while a pod operation
waits or runs, GC starts no plugin; it goes on when the operation ends. In-process plugins
(FakeExecutor): the order of their calls is what the test reads, never a clock."""

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
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.oprecord import NoSink, OperationLog
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.upkeep import Upkeep
from tests.support.aio import on_a_loop

STALE = [c * 64 for c in "abc"]
CONFLIST = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "p"}]}
OP_ENDS = "the operation ends"


def _upkeep(tmp_path, order: list[str]) -> Upkeep:
    cfg = parse_config(
        {
            "mode": "native",
            "state_dir": str(tmp_path / "state"),
            "cni": {"cache_dir": str(tmp_path / "cache"), "bin_dirs": [str(tmp_path / "bin")]},
            "networks": [{"name": "podnet", "default": True, "conflist": CONFLIST}],
            "gc": {"parallel": 2},
        }
    )
    fake = FakeExecutor(
        {"p": lambda call: order.append(f"{call.command} {call.env['CNI_CONTAINERID']}") or b""}
    )
    cni = CNIRuntime([str(tmp_path / "bin")], str(tmp_path / "cache"), executor=fake)
    for pod_id in STALE:
        cni.cache.write(
            CacheEntry(
                container_id=pod_id,
                ifname="eth0",
                network_name="podnet",
                config=json.dumps(CONFLIST).encode(),
                netns=str(tmp_path),
            )
        )
    intents = IntentStore(str(tmp_path / "state"))
    rollback = Rollback(cni, intents)
    detacher = Detacher(cni, intents=intents, rollback=rollback)
    return Upkeep(cfg, cni, rollback=rollback, detacher=detacher, oplog=OperationLog(NoSink()))


async def _read(locks: PodLocks, gc: asyncio.Task) -> None:
    """Until GC has read the cache (in a thread: no number of turns bounds that) and holds a
    stale pod's lock, or is done."""
    while not (gc.done() or any(locks.busy(p) for p in STALE)):
        await asyncio.sleep(0)


async def _turns(done, turns: int = 2000) -> None:
    """Lets every task that can run do so, until `done()` (no clock: turns of the loop)."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    "operation, dels_before_it_ends",
    [
        ("running", 0),  # an operation holds a live pod's lock: GC starts nothing meanwhile
        (None, 3),  # control: no operation, GC DELs every stale pod at once
    ],
)
def test_gc_starts_no_del_while_a_pod_operation_waits_or_runs(tmp_path, operation, dels_before_it_ends):
    order: list[str] = []
    upkeep = _upkeep(tmp_path, order)

    async def scenario() -> None:
        locks = PodLocks()
        release = asyncio.Event()

        async def op(pod_id: str) -> None:
            async with locks.pod(pod_id):
                await release.wait()

        ops = []
        if operation is not None:
            ops.append(asyncio.create_task(op("live")))
            await _turns(lambda: locks.busy("live"))
        gc = asyncio.create_task(upkeep.collect_garbage(set(), locks))
        await _read(locks, gc)
        await _turns(gc.done)
        order.append(OP_ENDS)
        release.set()
        await asyncio.gather(*ops)
        report = await gc
        assert sorted(report["deleted"]) == [f"podnet/{p}/eth0" for p in STALE]
        assert len(locks) == 0

    asyncio.run(scenario())

    dels = [e for e in order if e.startswith("DEL ")]
    assert len(dels) == 3
    before = order[: order.index(OP_ENDS)]
    assert sum(e.startswith("DEL ") for e in before) == dels_before_it_ends


@pytest.mark.parametrize(
    "arrives, dels_before_it_ends",
    [
        # one plugin a turn: an operation two turns after GC began finds one started (started
        # in one go, GC's first plugins would be both of its `parallel` 2)
        (2, 1),
        (None, 3),  # control: no operation, GC DELs every stale pod (its `parallel` slots, then more)
    ],
)
def test_gc_starts_one_plugin_a_turn_so_an_operation_that_comes_meanwhile_is_counted(
    tmp_path, arrives, dels_before_it_ends
):
    """GC's first plugins are not started in one go (as many as `parallel`, each without a turn
    of the loop between them): a pod's request the loop reads meanwhile stops the rest."""
    order: list[str] = []
    upkeep = _upkeep(tmp_path, order)

    async def scenario() -> None:
        locks = PodLocks()
        release = asyncio.Event()

        async def op() -> None:
            # GC reads the cache off the loop (a thread): its turns count from its first
            # stale pod's lock, taken once the reading is back
            await _read(locks, gc)
            for _ in range(arrives or 0):
                await asyncio.sleep(0)
            async with locks.pod("live"):
                await release.wait()

        gc = asyncio.create_task(upkeep.collect_garbage(set(), locks))
        ops = [asyncio.create_task(op())] if arrives is not None else []
        await _read(locks, gc)
        await _turns(gc.done)
        order.append(OP_ENDS)
        release.set()
        await asyncio.gather(*ops)
        await gc

    asyncio.run(scenario())
    before = order[: order.index(OP_ENDS)]
    assert sum(e.startswith("DEL ") for e in before) == dels_before_it_ends


def test_gc_reads_the_whole_cache_off_the_event_loop(tmp_path, monkeypatch):
    """Reading and parsing every entry took the loop ~10 ms with 40 stale pods (bench_gc: an
    ADD that came then began 10-13 ms late); in a thread, the loop reads requests meanwhile."""
    upkeep = _upkeep(tmp_path, [])
    whole: list[bool] = []  # per reading of the whole cache: was it on the event loop's thread
    real = upkeep.cni.cache.entries

    def entries(container_id=None, network=None):
        if container_id is None and network is None:
            whole.append(on_a_loop())
        return real(container_id, network)

    monkeypatch.setattr(upkeep.cni.cache, "entries", entries)

    async def scenario():
        assert on_a_loop()  # control: the probe tells the loop's thread
        return await upkeep.collect_garbage(set(), PodLocks())

    report = asyncio.run(scenario())
    assert sorted(report["deleted"]) == [f"podnet/{p}/eth0" for p in STALE]
    # the stale pods' listing (first) and the GC verb's valid attachments (last), both in a thread
    assert whole == [False, False], whole
