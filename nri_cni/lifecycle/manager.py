"""The network lifecycle: INIT each network generation before its first ADD, DEINIT it once it
left the configuration and its last attachment is gone. The rules are in docs/lifecycle.md.

One driver task per network name runs that network's verbs one at a time, so two verbs of one
network never overlap while different networks proceed in parallel. A driver sleeps until it is
kicked (a reload, an attachment gone, a lease returned) or a retry is due. Pod operations take a
lease on the generation they use: the lease waits for INIT, fails with INIT's error, and keeps
DEINIT away while the ADD runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

from nri_cni.cni.config import NetworkConfigList, parse_conflist
from nri_cni.errors import CniCode, CNIError, NriCniError, PluginRef
from nri_cni.lifecycle.generation import AttachmentCounter, Gen, not_ready_error
from nri_cni.lifecycle.records import GenerationRecord, RecordStore
from nri_cni.lifecycle.spec import DEINIT, INIT, generation_id, is_managed
from nri_cni.lifecycle.verbs import Sibling, VerbRunner

log = logging.getLogger("nri_cni.lifecycle")


class NetworkLifecycle:
    def __init__(
        self,
        runner: VerbRunner,
        store: RecordStore,
        attachments: AttachmentCounter,
        *,
        retry_initial: float = 1.0,
        retry_max: float = 300.0,
    ) -> None:
        self.runner = runner
        self.store = store
        self.attachments = attachments
        self.retry_initial = max(retry_initial, 0.001)
        self.retry_max = max(retry_max, self.retry_initial)
        self._gens: dict[str, dict[str, Gen]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._drivers: dict[str, asyncio.Task] = {}
        self._active: set[str] = set()  # networks whose driver is not asleep
        self._closed = False

    # -- the configuration -------------------------------------------------------------------

    async def start(self, networks: Iterable[NetworkConfigList]) -> None:
        """Loads what the previous run left (records), then applies the configuration."""
        for rec in await asyncio.to_thread(self.store.load_all):
            try:
                net = parse_conflist(rec.config, source=f"lifecycle record {rec.network}/{rec.generation}")
            except NriCniError as exc:
                log.error(
                    "lifecycle record of %s/%s holds an unusable config (%s); ignored",
                    rec.network,
                    rec.generation,
                    exc,
                )
                continue
            gen = Gen(rec.network, rec.generation, net, record=rec)
            gen.settled.set()
            self._gens.setdefault(rec.network, {})[rec.generation] = gen
        self.update(networks)
        for name in list(self._gens):  # what the last run left owed: DEINIT of a gone network
            self._kick(name)

    def update(self, networks: Iterable[NetworkConfigList]) -> None:
        """The configuration now names these networks (start-up or hot reload)."""
        wanted = {net.name: net for net in networks if is_managed(net)}
        touched = set(wanted)
        for name, gens in list(self._gens.items()):
            for gen in list(gens.values()):
                net = wanted.get(name)
                if gen.current and (net is None or generation_id(net.bytes) != gen.id):
                    self._retire(gen)
                    touched.add(name)
        for name, net in wanted.items():
            gid = generation_id(net.bytes)
            known = self._gens.setdefault(name, {})
            if gid not in known:
                known[gid] = Gen(name, gid, net)
            gen = known[gid]
            if not gen.current:
                gen.current = True
                gen.failures, gen.next_try, gen.deinit_error = 0, 0.0, None
                if gen.owes_init:
                    gen.init_error = None
                    gen.settled.clear()
                else:
                    gen.settled.set()
                    log.info("network %s: generation %s is current again, INIT already done", name, gid)
        for name in touched:
            self._kick(name)

    def _retire(self, gen: Gen) -> None:
        gen.current = False
        gen.failures, gen.next_try = 0, 0.0
        if gen.record is None and not gen.busy:
            # never INITed: nothing to undo. A lease waiting for it wakes up and sees it retired.
            gen.settled.set()
            del self._gens[gen.network][gen.id]
            return
        log.info(
            "network %s: generation %s retired; DEINIT once its attachments are gone", gen.network, gen.id
        )

    def poke(self, network: str | None = None) -> None:
        """An attachment may be gone (DEL, GC, failed ADD): re-check retired generations."""
        for name, gens in self._gens.items():
            if (network is None or name == network) and any(not g.current for g in gens.values()):
                self._kick(name)

    # -- leases (pod operations) -------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, net: NetworkConfigList) -> AsyncIterator[None]:
        """Hold while an ADD of `net` runs: waits for its INIT, raises its INIT error."""
        if not is_managed(net):
            yield
            return
        gen = self._gens.get(net.name, {}).get(generation_id(net.bytes))
        if gen is None:
            raise CNIError(
                CniCode.TRY_AGAIN_LATER,
                f"network {net.name!r}: this configuration is no longer in use, retry",
                ref=PluginRef(network=net.name),
            )
        gen.in_flight += 1
        gen.epoch += 1
        try:
            while not gen.ready:
                if not gen.current:  # replaced while we came here: never ADD with it now
                    raise CNIError(
                        CniCode.TRY_AGAIN_LATER,
                        f"network {net.name!r}: this configuration was replaced, retry",
                        ref=PluginRef(network=net.name),
                    )
                if gen.init_error is not None and gen.busy != INIT:
                    raise not_ready_error(gen)  # in back-off: fail now rather than hang the pod
                await gen.settled.wait()  # cleared while an INIT is owed or running
            yield
        finally:
            gen.in_flight -= 1
            if not gen.current and gen.in_flight == 0:
                self._kick(gen.network)

    @asynccontextmanager
    async def leases(self, nets: Iterable[NetworkConfigList]) -> AsyncIterator[None]:
        """Leases on several networks, all taken before the caller's first ADD."""
        async with AsyncExitStack() as stack:
            for net in nets:
                await stack.enter_async_context(self.lease(net))
            yield

    # -- reports -----------------------------------------------------------------------------

    def not_ready(self) -> dict[str, str]:
        """Current networks whose INIT failed (and has not succeeded since): network -> error."""
        out = {}
        for name, gens in self._gens.items():
            for gen in gens.values():
                if gen.current and not gen.ready and gen.init_error is not None:
                    out[name] = f"INIT failed: {gen.init_error}"
        return out

    def report(self) -> dict[str, dict]:
        """Per network: the current generation's state and the retired ones still owed DEINIT."""
        out: dict[str, dict] = {}
        for name, gens in sorted(self._gens.items()):
            entry: dict = {"generation": "", "state": "", "error": "", "retired": []}
            for gen in gens.values():
                if gen.current:
                    entry.update(
                        generation=gen.id,
                        state=gen.state(),
                        error=str(gen.init_error) if gen.init_error and not gen.ready else "",
                        failures=gen.failures,
                    )
                else:
                    entry["retired"].append(
                        {
                            "generation": gen.id,
                            "state": gen.state(),
                            "error": str(gen.deinit_error) if gen.deinit_error else "",
                            "attachments": gen.attachments + gen.in_flight,
                            "failures": gen.failures,
                        }
                    )
            out[name] = entry
        return out

    # -- the drivers -------------------------------------------------------------------------

    def _kick(self, network: str) -> None:
        if self._closed:
            return
        self._wake.setdefault(network, asyncio.Event()).set()
        self._active.add(network)
        task = self._drivers.get(network)
        if task is None or task.done():
            self._drivers[network] = asyncio.create_task(self._drive(network), name=f"lifecycle-{network}")

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._drivers.clear()
        self._active.clear()

    async def idle(self) -> None:
        """Waits until every driver is asleep: no verb due now (tests use it)."""
        while self._active:  # noqa: ASYNC110 - tests poll until every driver sleeps
            await asyncio.sleep(0.01)

    async def _drive(self, network: str) -> None:
        wake = self._wake[network]
        loop = asyncio.get_running_loop()
        while True:
            wake.clear()
            gen, delay = await self._next(network, loop.time())
            if gen is not None:
                await (self._init(gen) if gen.current else self._deinit(gen))
                continue
            if not self._gens.get(network):
                self._gens.pop(network, None)
                self._drivers.pop(network, None)
                self._wake.pop(network, None)
                self._active.discard(network)
                return
            self._active.discard(network)
            try:
                await asyncio.wait_for(wake.wait(), delay)
            except TimeoutError:
                pass
            self._active.add(network)

    async def _next(self, network: str, now: float) -> tuple[Gen | None, float | None]:
        """The generation whose verb is due (DEINITs first: a replaced config hands over its
        resources before the new one takes them), or None and how long to sleep."""
        gens = list(self._gens.get(network, {}).values())
        delay: float | None = None
        retired = [g for g in gens if g.owes_deinit and not g.busy]
        if retired:
            epochs = {g.id: g.epoch for g in retired}
            counts = await self.attachments()
            for gen in retired:
                gen.attachments = counts.get((network, gen.id), 0)
                if gen.current or not gen.owes_deinit or gen.busy:
                    continue  # changed while counting
                if gen.attachments or gen.in_flight or gen.epoch != epochs[gen.id]:
                    if gen.epoch != epochs[gen.id]:
                        delay = 0.0  # a lease came and went during the count: count again
                    continue
                if gen.next_try > now:
                    delay = _min(delay, gen.next_try - now)
                    continue
                return gen, None
        for gen in gens:
            if gen.owes_init and not gen.busy:
                if gen.next_try > now:
                    delay = _min(delay, gen.next_try - now)
                    continue
                return gen, None
        return None, delay

    def _siblings(self, gen: Gen) -> list[Sibling]:
        return [
            Sibling(g.id, g.net.bytes)
            for g in self._gens.get(gen.network, {}).values()
            if g is not gen and g.record is not None
        ]

    async def _init(self, gen: Gen) -> None:
        gen.busy = INIT
        gen.settled.clear()
        rec = gen.record or GenerationRecord(gen.network, gen.id, gen.net.bytes, "init")
        try:
            rec.phase = "init"
            await asyncio.to_thread(self.store.write, rec)  # before the verb: a crash still owes it
            gen.record = rec
            ran = await self.runner.run(INIT, gen.net, gen.id, self._siblings(gen))
            rec.phase, rec.error = "ready", ""
            await asyncio.to_thread(self.store.write, rec)
        except NriCniError as exc:
            gen.init_error = exc
            self._failed(gen, INIT, exc)
            try:
                rec.error = str(exc)
                if gen.record is not None:
                    await asyncio.to_thread(self.store.write, rec)
            except NriCniError as wexc:
                log.error("network %s: %s", gen.network, wexc)
        else:
            gen.init_error, gen.failures, gen.next_try = None, 0, 0.0
            log.info("network %s: INIT of generation %s done (%d plugin(s))", gen.network, gen.id, ran)
        finally:
            gen.busy = ""
            gen.settled.set()
            if not gen.current:  # replaced while INIT ran: it now owes a DEINIT (if it began)
                if gen.record is None:
                    self._gens[gen.network].pop(gen.id, None)
                self._kick(gen.network)

    async def _deinit(self, gen: Gen) -> None:
        gen.busy = DEINIT
        rec = gen.record
        assert rec is not None
        try:
            rec.phase = "deinit"
            await asyncio.to_thread(self.store.write, rec)
            ran = await self.runner.run(DEINIT, gen.net, gen.id, self._siblings(gen))
            await asyncio.to_thread(self.store.remove, gen.network, gen.id)
        except NriCniError as exc:
            gen.deinit_error = exc
            self._failed(gen, DEINIT, exc)
            try:
                rec.error = str(exc)
                await asyncio.to_thread(self.store.write, rec)
            except NriCniError as wexc:
                log.error("network %s: %s", gen.network, wexc)
        else:
            log.info("network %s: DEINIT of generation %s done (%d plugin(s))", gen.network, gen.id, ran)
            gen.record, gen.deinit_error, gen.failures, gen.next_try = None, None, 0, 0.0
            if not gen.current:
                del self._gens[gen.network][gen.id]
        finally:
            gen.busy = ""
            if gen.current and gen.owes_init:
                gen.settled.clear()  # back in the config while DEINIT ran: INIT comes next

    def _failed(self, gen: Gen, verb: str, exc: NriCniError) -> None:
        gen.failures += 1
        wait = min(self.retry_max, self.retry_initial * 2 ** (gen.failures - 1))
        gen.next_try = asyncio.get_running_loop().time() + wait
        log.error(
            "network %s: %s of generation %s failed (attempt %d, retry in %.1fs): %s",
            gen.network,
            verb,
            gen.id,
            gen.failures,
            wait,
            exc,
        )


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
