"""GC's executor (nri_cni/pod/upkeep.py) wraps whatever executor the runtime has: the same
plugins found, each exec through one of GC's slots, at GC's nice level."""

from __future__ import annotations

import asyncio

from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.upkeep import GC_PLUGIN_NICE, _gated


def test_gc_wraps_the_runtimes_executor(tmp_path):
    nice_seen = []
    fake = FakeExecutor({"p": lambda call: nice_seen.append(PLUGIN_NICE.get()) or b""})
    runtime = CNIRuntime([str(tmp_path)], cache_dir=str(tmp_path / "cache"), executor=fake)
    locks = PodLocks()
    gated = _gated(runtime, locks, parallel=2)
    assert gated is not runtime and runtime.executor is fake  # the runtime itself is unchanged
    assert gated.executor.inner is fake and gated.executor.find("p", ["/x"]) == fake.find("p", ["/x"])

    async def scenario():
        async def one():
            return await gated.executor.exec(fake.find("p", []), {"CNI_COMMAND": "GC"}, b"", 10)

        assert await asyncio.gather(one(), one()) == [b"", b""]
        assert locks._gc_slots == 0  # every slot given back

    asyncio.run(scenario())
    assert nice_seen == [GC_PLUGIN_NICE, GC_PLUGIN_NICE] and PLUGIN_NICE.get() == 0
    assert fake.commands() == ["GC", "GC"]
