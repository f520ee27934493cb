"""The cache seam: the same runtime with no cache shares its hooks, executor and bin dirs and
writes nothing."""

from __future__ import annotations

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.nocache import NO_CACHE
from nri_cni.cni.runtime import CNIRuntime, RuntimeHooks


def test_with_no_cache_the_same_runtime_writes_nothing(tmp_path):
    hooks = RuntimeHooks()
    runtime = CNIRuntime([str(tmp_path)], str(tmp_path / "cache"), hooks=hooks)
    uncached = runtime.with_cache(NO_CACHE)
    assert (
        uncached.hooks is hooks
        and uncached.executor is runtime.executor
        and uncached.bin_dirs == runtime.bin_dirs
    )
    write = NO_CACHE.prepare(CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}"))
    write.prepare()
    write.commit({"cniVersion": "1.1.0"})
    assert NO_CACHE.read("n", "c", "eth0") is None and NO_CACHE.entries() == []
    assert not (tmp_path / "cache").exists()
