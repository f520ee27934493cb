"""A CNI result cache that keeps nothing (NO_CACHE), for CNIRuntime.with_cache()."""

from __future__ import annotations

from typing import Any

from nri_cni.cni.cache import CacheEntry, PreparedWrite, ResultCache


class NoCache(ResultCache):
    """A cache that keeps nothing. For FINALIZE of an attachment nri-cni does not own
    (secondary mode: the runtime's primary network, whose entry is the runtime's): a result a
    finalize plugin changed is answered, never written into nri-cni's cache."""

    def __init__(self) -> None:
        super().__init__(cache_dir="")

    def prepare(self, entry: CacheEntry) -> PreparedWrite:
        return _NoWrite(self, entry)

    def sync_later(self, network: str, container_id: str, ifname: str) -> None:
        return None

    def read(self, network: str, container_id: str, ifname: str, *, drop_corrupt: bool = False) -> None:
        return None

    def delete(self, network: str, container_id: str, ifname: str) -> None:
        return None

    def entries(self, container_id: str | None = None, network: str | None = None) -> list[CacheEntry]:
        return []


class _NoWrite(PreparedWrite):
    def prepare(self) -> None:
        return None

    def commit(self, result: dict[str, Any] | None, *, durable: bool = True) -> None:
        self._done = True


NO_CACHE = NoCache()
