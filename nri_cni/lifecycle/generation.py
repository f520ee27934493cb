"""One generation of one network as the lifecycle driver sees it (its record, what it owes,
its leases), and how attachments are counted per generation."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nri_cni.cni.cache import ResultCache
from nri_cni.cni.config import NetworkConfigList
from nri_cni.errors import CniCode, CNIError, NriCniError
from nri_cni.lifecycle.records import GenerationRecord
from nri_cni.lifecycle.spec import DEINIT, INIT, generation_id

GenKey = tuple[str, str]  # (network, generation)
AttachmentCounter = Callable[[], Awaitable[Counter]]


@dataclass(eq=False)
class Gen:
    """One generation of one network, as the driver sees it."""

    network: str
    id: str
    net: NetworkConfigList
    record: GenerationRecord | None = None  # None: no verb ever ran for it (or DEINIT finished)
    current: bool = False  # the configuration names this generation now
    busy: str = ""  # the verb running now
    init_error: NriCniError | None = None  # last INIT failure, until an INIT succeeds
    deinit_error: NriCniError | None = None
    failures: int = 0  # consecutive failures of the verb now owed
    next_try: float = 0.0  # loop time before which that verb is not retried
    in_flight: int = 0  # leases held (ADDs running with this generation)
    epoch: int = 0  # bumped by every lease: an attachment count taken across one is stale
    attachments: int = 0  # at the last count (retired generations only)
    # set while no INIT is owed or running: what a lease waits for
    settled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ready(self) -> bool:
        return self.record is not None and self.record.phase == "ready" and self.busy != DEINIT

    @property
    def owes_init(self) -> bool:
        return self.current and not (self.record is not None and self.record.phase == "ready")

    @property
    def owes_deinit(self) -> bool:
        return not self.current and self.record is not None

    def state(self) -> str:
        if self.busy:
            return "initializing" if self.busy == INIT else "deinitializing"
        if self.current:
            if self.ready:
                return "ready"
            return "init failed" if self.init_error else "init pending"
        if self.deinit_error:
            return "deinit failed"
        return f"retired, {self.attachments + self.in_flight} attachment(s) left"


def cache_counter(cache: ResultCache) -> AttachmentCounter:
    """Counts the cached attachments of each (network, generation)."""

    def count() -> Counter:
        return Counter((e.network_name, generation_id(e.config)) for e in cache.entries())

    async def counter() -> Counter:
        return await asyncio.to_thread(count)

    return counter


def not_ready_error(gen: Gen) -> CNIError:
    cause = gen.init_error
    # no ref: the message names the network already, and the cause names the plugin
    return CNIError(
        CniCode.PLUGIN_NOT_AVAILABLE,
        f"network {gen.network!r} is not ready: INIT failed",
        details=str(cause) if cause else "",
    )
