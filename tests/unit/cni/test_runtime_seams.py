"""The runtime's seams: the same runtime with no cache shares its executor and bin dirs and
writes nothing; the same runtime with another executor shares its cache."""

from __future__ import annotations

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.nocache import NO_CACHE
from nri_cni.cni.runtime import CNIRuntime


def test_with_no_cache_the_same_runtime_writes_nothing(tmp_path):
    runtime = CNIRuntime([str(tmp_path)], str(tmp_path / "cache"), executor=FakeExecutor({}))
    uncached = runtime.with_cache(NO_CACHE)
    assert (
        uncached.cache is NO_CACHE
        and uncached.executor is runtime.executor
        and uncached.bin_dirs == runtime.bin_dirs
    )
    write = NO_CACHE.prepare(CacheEntry(container_id="c", ifname="eth0", network_name="n", config=b"{}"))
    write.prepare()
    write.commit({"cniVersion": "1.1.0"})
    assert NO_CACHE.read("n", "c", "eth0") is None and NO_CACHE.entries() == []
    assert not (tmp_path / "cache").exists()


def test_with_another_executor_the_same_runtime_keeps_its_cache(tmp_path):
    runtime = CNIRuntime(
        [str(tmp_path)], str(tmp_path / "cache"), executor=FakeExecutor({}), exec_timeout=7, pass_env=["X"]
    )
    other = FakeExecutor({})
    wrapped = runtime.with_executor(other)
    assert wrapped.executor is other and runtime.executor is not other
    assert (wrapped.cache, wrapped.bin_dirs, wrapped.exec_timeout, wrapped.pass_env) == (
        runtime.cache,
        runtime.bin_dirs,
        7,
        ("X",),
    )
