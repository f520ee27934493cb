"""NetworkLifecycle against the real executor and the lifecycle test plugin (no namespaces):
INIT once per generation, leases, retries, DEINIT after the last attachment, restarts."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from nri_cni.cni.exec import PluginExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.errors import CniCode, CNIError
from nri_cni.lifecycle import GenerationRecord, NetworkLifecycle, RecordStore, VerbRunner, generation_id


class Attachments:
    """A hand-driven attachment count per (network, generation)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def set(self, net, n: int) -> None:
        self.counts[(net.name, generation_id(net.bytes))] = n

    async def __call__(self) -> Counter:
        return Counter(self.counts)


def manager(world, attachments=None, **kw) -> NetworkLifecycle:
    cni = CNIRuntime([str(world.bin_dir)], str(world.cache_dir), exec_timeout=20, executor=PluginExecutor())
    return NetworkLifecycle(
        VerbRunner(cni),
        RecordStore(str(world.state_dir)),
        attachments or Attachments(),
        retry_initial=kw.get("retry_initial", 0.05),
        retry_max=kw.get("retry_max", 0.2),
    )


def gid(net) -> str:
    return generation_id(net.bytes)


async def until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def records(world) -> dict[str, dict]:
    root = world.state_dir / "networks"
    return {f"{p.parent.name}/{p.stem}": json.loads(p.read_text()) for p in root.glob("*/*.json")}


def test_init_once_per_generation_with_the_network_config_and_survives_a_restart(world):
    a = world.net("neta", world.plugin(tag=1))

    async def scenario():
        lc = manager(world)
        await lc.start([a])
        await lc.idle()
        lc.update([a])  # a reload that does not change the network
        await lc.idle()
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(a))]
        call = world.calls.verbs("INIT")[0]
        assert call["name"] == "neta" and call["tag"] == 1 and call["others"] == []
        assert call["env"] == {
            "CNI_COMMAND": "INIT",
            "CNI_CONTAINERID": "",
            "CNI_NETNS": "",
            "CNI_IFNAME": "",
            "CNI_ARGS": "",
            "CNI_PATH": str(world.bin_dir),
        }
        assert records(world)[f"neta/{gid(a)}"]["phase"] == "ready"

        lc = manager(world)  # nri-cni restarted: INIT already ran for this generation
        await lc.start([a])
        await lc.idle()
        assert lc.report()["neta"]["state"] == "ready"
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(a))]

        lc = manager(world)  # restarted with the network gone from the config
        await lc.start([])
        await lc.idle()
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(a)), ("DEINIT", gid(a))]
        assert world.calls.verbs("DEINIT")[0]["tag"] == 1  # the config it was INITed with
        assert records(world) == {}
        assert list((world.state_dir / "networks").iterdir()) == []

    asyncio.run(scenario())


def test_a_lease_waits_for_init(world):
    a = world.net("neta", world.plugin(init_sleep=0.5))

    async def scenario():
        lc = manager(world)
        await lc.start([a])
        t0 = time.time()
        async with lc.lease(a):
            entered = time.time()
            assert lc.report()["neta"]["state"] == "ready"
            assert records(world)[f"neta/{gid(a)}"]["phase"] == "ready"
        await lc.close()
        init = world.calls.verbs("INIT")
        assert len(init) == 1 and init[0]["t"] < entered and entered - t0 >= 0.45

    asyncio.run(scenario())


def test_init_failure_fails_leases_with_its_error_then_retries_with_backoff(world):
    a = world.net("neta", world.plugin(fail_init=2))

    async def scenario():
        lc = manager(world, retry_initial=0.3, retry_max=0.6)
        await lc.start([a])
        await until(lambda: lc.report()["neta"]["state"] == "init failed")
        with pytest.raises(CNIError) as err:
            async with lc.lease(a):
                raise AssertionError("a lease on a network whose INIT failed")
        assert err.value.code == CniCode.PLUGIN_NOT_AVAILABLE
        assert "INIT failed" in str(err.value) and "fails on purpose" in str(err.value)
        assert "fails on purpose" in lc.not_ready()["neta"]
        assert records(world)[f"neta/{gid(a)}"]["phase"] == "init"
        await until(lambda: lc.report()["neta"]["state"] == "ready")
        async with lc.lease(a):
            pass
        assert lc.not_ready() == {}
        await lc.close()
        init = world.calls.verbs("INIT")
        assert len(init) == 3
        gaps = [b["t"] - a_["t"] for a_, b in zip(init, init[1:])]
        assert gaps[0] >= 0.25 and gaps[1] >= 0.5  # backed off 0.3 s, then 0.6 s
        assert world.calls.verbs("DEINIT") == []

    asyncio.run(scenario())


def test_a_changed_network_inits_the_new_generation_and_deinits_the_old_after_its_last_attachment(world):
    old = world.net("neta", world.plugin(tag="old"))
    new = world.net("neta", world.plugin(tag="new"))
    counts = Attachments()

    async def scenario():
        lc = manager(world, counts)
        await lc.start([old])
        await lc.idle()
        counts.set(old, 2)  # two pods attached with the old config
        lc.update([new])
        await lc.idle()
        assert world.calls.seq() == [("INIT", gid(old)), ("INIT", gid(new))]
        retired = lc.report()["neta"]["retired"]
        assert [(r["generation"], r["attachments"]) for r in retired] == [(gid(old), 2)]
        async with lc.lease(old):  # an ADD that chose the old config just before the reload
            pass
        counts.set(old, 1)
        lc.poke()
        await lc.idle()
        assert len(world.calls.seq()) == 2
        counts.set(old, 0)
        lc.poke("neta")
        await lc.idle()
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(old)), ("INIT", gid(new)), ("DEINIT", gid(old))]
        deinit = world.calls.verbs("DEINIT")[0]
        assert deinit["tag"] == "old" and deinit["others"] == [gid(new)]
        assert list(records(world)) == [f"neta/{gid(new)}"]

    asyncio.run(scenario())


def test_an_unused_old_generation_is_deinited_before_the_new_one_is_inited(world):
    old = world.net("neta", world.plugin(tag="old"))
    new = world.net("neta", world.plugin(tag="new"))

    async def scenario():
        lc = manager(world)
        await lc.start([old])
        await lc.idle()
        lc.update([new])
        await lc.idle()
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(old)), ("DEINIT", gid(old)), ("INIT", gid(new))]
        assert world.calls.verbs("DEINIT")[0]["others"] == []

    asyncio.run(scenario())


def test_a_reverted_change_does_not_init_twice(world):
    one = world.net("neta", world.plugin(tag=1))
    two = world.net("neta", world.plugin(tag=2))
    counts = Attachments()

    async def scenario():
        lc = manager(world, counts)
        await lc.start([one])
        await lc.idle()
        counts.set(one, 1)
        lc.update([two])
        await lc.idle()
        lc.update([one])  # back: generation one is still live, INIT already ran
        await lc.idle()
        await lc.close()
        assert world.calls.seq() == [("INIT", gid(one)), ("INIT", gid(two)), ("DEINIT", gid(two))]
        assert world.calls.verbs("DEINIT")[0]["others"] == [gid(one)]

    asyncio.run(scenario())


def test_a_failed_deinit_is_retried_and_blocks_no_other_network(world):
    gone = world.net("gone", world.plugin(fail_deinit=2, tag="gone"))
    other = world.net("other", world.plugin(tag="other"))

    async def scenario():
        lc = manager(world, retry_initial=0.3, retry_max=0.3)
        await lc.start([gone])
        await lc.idle()
        lc.update([other])
        await until(
            lambda: lc.report().get("gone", {}).get("retired", [{}])[0].get("state") == "deinit failed"
        )
        await until(lambda: lc.report()["other"]["state"] == "ready")  # not held up
        report = lc.report()["gone"]["retired"][0]
        assert "fails on purpose" in report["error"] and report["failures"] >= 1
        assert records(world)[f"gone/{gid(gone)}"]["phase"] == "deinit"
        await until(lambda: "gone" not in lc.report())
        await lc.close()
        assert [c for c, _ in world.calls.seq("gone")] == ["INIT", "DEINIT", "DEINIT", "DEINIT"]
        assert world.calls.seq("other") == [("INIT", gid(other))]
        assert list(records(world)) == [f"other/{gid(other)}"]

    asyncio.run(scenario())


def test_networks_proceed_in_parallel_and_one_network_never_overlaps(world):
    gate = world.tmp / "gate"  # both first INITs wait for it: it opens once both have started
    x = world.net("netx", world.plugin(init_gate=str(gate)))
    y = world.net("nety", world.plugin(init_gate=str(gate)))
    x2 = world.net("netx", world.plugin(init_sleep=0.3, deinit_sleep=0.3, tag=2))

    async def scenario():
        lc = manager(world)
        await lc.start([x, y])
        # netx and nety run at once (one at a time, the second would never start: a deadline)
        await until(lambda: {c["name"] for c in world.calls.verbs("INIT")} == {"netx", "nety"})
        lc.update([x2, y])  # while x's INIT runs: its DEINIT and x2's INIT must wait for it
        gate.touch()
        await lc.idle()
        await lc.close()
        assert world.calls.seq("netx") == [("INIT", gid(x)), ("DEINIT", gid(x)), ("INIT", gid(x2))]
        assert world.calls.seq("nety") == [("INIT", gid(y))]
        assert not [c for c in world.calls.all() if c.get("overlap")]

    asyncio.run(scenario())


def test_only_plugins_that_declare_a_verb_get_it_in_add_and_del_order(world):
    net = world.net(
        "mixed",
        world.fake(),
        world.plugin("lifecycle-test", tag="first"),
        world.plugin("lifecycle-test2", tag="second"),
        world.plugin("lifecycle-test", verbs=["init"], tag="init-only"),
        world.plugin("lifecycle-test2", verbs=["deinit"], tag="deinit-only"),
        world.plugin("lifecycle-test", verbs=None, tag="undeclared"),
    )

    async def scenario():
        lc = manager(world)
        await lc.start([net])
        await lc.idle()
        lc.update([])
        await lc.idle()
        await lc.close()
        tags = [(c["command"], c["tag"]) for c in world.calls.verbs("INIT", "DEINIT")]
        assert tags == [
            ("INIT", "first"),
            ("INIT", "second"),
            ("INIT", "init-only"),
            ("DEINIT", "deinit-only"),
            ("DEINIT", "second"),
            ("DEINIT", "first"),
        ]
        assert not world.fake_log.exists()  # the plugin without the key was never run

    asyncio.run(scenario())


def test_an_interrupted_verb_is_finished_after_a_restart(world):
    a = world.net("neta", world.plugin(tag="a"))
    b = world.net("netb", world.plugin(tag="b"))
    store = RecordStore(str(world.state_dir))
    # a crash while INIT of a ran, and while DEINIT of b (gone from the config) ran
    store.write(GenerationRecord("neta", gid(a), a.bytes, "init"))
    store.write(GenerationRecord("netb", gid(b), b.bytes, "deinit"))

    async def scenario():
        lc = manager(world)
        await lc.start([a])
        await lc.idle()
        await lc.close()
        assert world.calls.seq("neta") == [("INIT", gid(a))]
        assert world.calls.seq("netb") == [("DEINIT", gid(b))]
        assert world.calls.verbs("DEINIT")[0]["tag"] == "b"
        assert {k: v["phase"] for k, v in records(world).items()} == {f"neta/{gid(a)}": "ready"}

    asyncio.run(scenario())


def test_a_lease_on_a_config_that_is_not_in_use_is_refused(world):
    a = world.net("neta", world.plugin(tag=1))
    unknown = world.net("neta", world.plugin(tag=2))
    plain = world.net("plain", world.fake())

    async def scenario():
        lc = manager(world)
        await lc.start([a])
        with pytest.raises(CNIError) as err:
            async with lc.lease(unknown):
                pass
        assert err.value.code == CniCode.TRY_AGAIN_LATER
        async with lc.lease(plain):  # a network without lifecycle plugins never waits
            pass
        await lc.close()

    asyncio.run(scenario())


def test_records_survive_torn_writes_and_keep_unreadable_files(world, caplog):
    store = RecordStore(str(world.state_dir))
    a = world.net("neta", world.plugin())
    store.write(GenerationRecord("neta", gid(a), a.bytes, "ready"))
    netdir = world.state_dir / "networks" / "neta"
    (netdir / ".torn.123.0.tmp").write_text("{")  # a crash mid-write: the old record stands
    (netdir / "ffffffffffffffff.json").write_text("not json")
    loaded = store.load_all()
    assert [(r.network, r.generation, r.phase, r.config) for r in loaded] == [
        ("neta", gid(a), "ready", a.bytes)
    ]
    assert not (netdir / ".torn.123.0.tmp").exists()
    assert (netdir / "ffffffffffffffff.json").exists()  # kept for a person: a DEINIT may be owed
    assert "unreadable" in caplog.text


def test_the_cache_counter_counts_attachments_per_generation(world):
    from nri_cni.cni.cache import CacheEntry, ResultCache
    from nri_cni.lifecycle import cache_counter

    one, two = world.net("neta", world.plugin(tag=1)), world.net("neta", world.plugin(tag=2))
    cache = ResultCache(str(world.cache_dir))
    for cid, net in (("c1", one), ("c2", one), ("c3", two)):
        cache.write(
            CacheEntry(
                container_id=cid,
                ifname="eth0",
                network_name="neta",
                config=net.bytes,
                result={"cniVersion": "1.1.0"},
            )
        )
    counts = asyncio.run(cache_counter(cache)())
    assert counts == Counter({("neta", gid(one)): 2, ("neta", gid(two)): 1})
