"""What a verify round reports of a repair it ran, or could not run: the reason in the
admin's words (what differed, the plugin's error, the action), each attachment's verdict as
read, the warning of a repair that is tried again, and whether the pod is settled (no attach
retry left: Roster.settled). Each test states its control case: the same rounds with the one
input changed that flips the outcome. Without root: the plugins are the fake executor's, the
node inspector a fake."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.exec_errors import Ended
from nri_cni.errors import NriCniError
from nri_cni.pod.model import PodInfo
from nri_cni.service.decide import ADMIN_ACTION
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from tests.support import verifyworld
from tests.support.verifyworld import Inspector

POD = "e8" * 32
IP = "10.79.0.2"
UNASKABLE = {"type": "e8-br"}  # no `ips` capability, no IPAM that reads args.cni.ips
BUSY = Ended(stdout=b'{"cniVersion":"1.1.0","code":11,"msg":"bridge is busy"}', status=1)


def World(tmp: Path, **kw: Any) -> verifyworld.World:
    w = verifyworld.World(tmp, tag="e8", ip=IP, **kw)
    w.svc.verifier.clock = lambda: 100.0  # the backoff's: a retry's wait is exact
    return w


def seen(health: PodHealth) -> list[tuple[str, str, str]]:
    return [(a.network, a.ifname, a.finding) for a in health.attachments]


@pytest.mark.parametrize("repair", ["on", "verify-only"], ids=["ips-not-requestable", "control-repair-off"])
def test_a_chain_that_cannot_be_asked_for_the_address_says_why_and_settles_the_pod(tmp_path, repair):
    """eth0 found damaged, its chain unable to be asked for its IP, the pod's attach retried
    (attach failed): broken ips-not-requestable, the reason naming what differs, why nothing
    was cut and the admin's action, eth0's verdict as read, and the pod settled (no attach
    retry: nothing can make it true). Control: repair verify-only -> broken repair-off, the
    attach retry kept (a repair may come once repair is on)."""
    w = World(tmp_path, inspector=Inspector("damaged"), plugin=UNASKABLE, settings={"repair": repair})

    async def scenario() -> PodHealth:
        await w.attached_and_listed()
        w.svc.roster.attach_failed(POD)
        (health,) = await w.svc.timers.verify()
        return health

    health = w.run(scenario)
    assert seen(health) == [("podnet", "eth0", "link-missing")]
    assert health.reason.startswith("podnet/eth0: no eth0")
    assert w.fake.commands() == ["ADD", "CHECK"]  # nothing cut (the CHECK: netlink found a difference)
    if repair == "on":
        assert health.code is BrokenCode.IPS_NOT_REQUESTABLE
        assert "no plugin of its chain can be asked for an address" in health.reason
        assert health.reason.endswith(f"; {ADMIN_ACTION}")
        assert not w.svc.roster.record(POD).attach_failed
    else:
        assert health.code is BrokenCode.REPAIR_OFF
        assert w.svc.roster.record(POD).attach_failed


@pytest.mark.parametrize("add", [BUSY, None], ids=["add-fails", "control-add-works"])
def test_a_repair_that_keeps_failing_is_reported_with_the_plugins_error(tmp_path, caplog, add):
    """eth0 found damaged; each repair DELs it and its ADD fails ("bridge is busy"). The first
    failure is a warning that says when it is tried again (1 s); no verdict yet. The third
    (explicit rounds: no backoff wait) makes it broken repair-failed: the reason ends with the
    plugin's error, eth0's verdict is as that round read it (not attached). Control: the ADD
    works -> repaired at the first round, no warning."""
    caplog.set_level(logging.WARNING, logger="nri_cni.daemon")
    w = World(tmp_path, inspector=Inspector("damaged"))

    async def scenario() -> list[PodHealth | None]:
        await w.attached_and_listed()
        w.add_answer = add
        await w.svc.timers.verify()
        out = [w.svc.health.get(POD)]
        if add is not None:
            for _ in range(2):
                await w.svc.timers.verify(POD)
            out.append(w.svc.health.get(POD))
        return out

    verdicts = w.run(scenario)
    retried = [r.getMessage() for r in caplog.records if "again in" in r.getMessage()]
    if add is None:
        (health,) = verdicts
        assert health is not None and health.state is PodState.REPAIRED and retried == []
        return
    first, last = verdicts
    assert first is None
    assert len(retried) == 2
    assert f"pod default/e8-pod id={POD}: repair failed (try 1 of 3): " in retried[0]
    assert "bridge is busy" in retried[0] and retried[0].endswith(" (again in 1 s)")
    assert last is not None and (last.state, last.code) == (PodState.BROKEN, BrokenCode.REPAIR_FAILED)
    assert last.reason.startswith("podnet/eth0: not attached; repair failed 3 times, the last: ")
    assert last.reason.endswith("bridge is busy (CNI code 11) (retried with backoff)")
    assert seen(last) == [("podnet", "eth0", "missing")]


@pytest.mark.parametrize("after", ["damaged", "ok"], ids=["still-damaged", "control-repaired"])
def test_a_repair_after_which_netlink_still_finds_the_damage_fails(tmp_path, after):
    """eth0 found damaged; the repair's DEL and ADD work, and the read after it finds eth0
    damaged still: a failure, tried again; broken repair-failed after three, the reason saying
    what still differs, eth0's verdict as the round read it. Control: the read after the repair
    finds eth0 as its result says -> repaired."""
    answers = ["damaged", after] * 3  # per round: its read, then the read after the repair
    w = World(tmp_path, inspector=Inspector(*answers))

    async def scenario() -> PodHealth | None:
        await w.attached_and_listed()
        await w.svc.timers.verify()
        if after == "damaged":
            assert w.svc.health.get(POD) is None  # tried again: no verdict yet
            for _ in range(2):
                await w.svc.timers.verify(POD)
        return w.svc.health.get(POD)

    health = w.run(scenario)
    assert health is not None
    if after == "ok":
        assert health.state is PodState.REPAIRED and seen(health) == [("podnet", "eth0", "ok")]
        return
    assert (health.state, health.code) == (PodState.BROKEN, BrokenCode.REPAIR_FAILED)
    assert health.reason.endswith("the last: still differs after the repair: no eth0 (retried with backoff)")
    assert seen(health) == [("podnet", "eth0", "link-missing")]
    assert w.fake.commands() == ["ADD"] + ["CHECK", "DEL", "ADD"] * 3


@pytest.mark.parametrize("error", ["", "bridge: no such link"], ids=["check-passes", "control-check-fails"])
def test_a_verdict_given_under_the_pods_lock_lists_each_attachments_verdict(tmp_path, error):
    """A forced CHECK (`nri-cni verify --check`, repair verify-only) of a pod netlink found
    intact runs under the pod's lock; its verdict lists eth0's: ok. Control: the CHECK fails ->
    broken repair-off, eth0's verdict check-failed with the plugin's error."""
    w = World(tmp_path, settings={"repair": "verify-only"})

    def check(call: Any) -> Ended | bytes:
        if not error:
            return b""
        return Ended(stdout=f'{{"cniVersion":"1.1.0","code":999,"msg":"{error}"}}'.encode(), status=1)

    w.fake.plugins["e8-br"]["CHECK"] = check

    async def scenario() -> PodHealth:
        await w.attached_and_listed()
        (health,) = await w.svc.timers.verify(check=True)
        return health

    health = w.run(scenario)
    assert w.fake.commands() == ["ADD", "CHECK"]
    if not error:
        assert health.state is PodState.OK and seen(health) == [("podnet", "eth0", "ok")]
        return
    assert health.code is BrokenCode.REPAIR_OFF
    (verdict,) = health.attachments
    assert (verdict.network, verdict.ifname, verdict.finding) == ("podnet", "eth0", "check-failed")
    assert error in verdict.detail


@pytest.mark.parametrize("message", ["", "the bridge went away"], ids=["empty", "control-with-words"])
def test_a_repair_that_fails_without_words_is_a_failure_all_the_same(tmp_path, message):
    """The repair raises an error with no message: a failure like any other (no verdict, the
    backoff counts it), broken repair-failed at the third. Control: the same failure with a
    message -> the same outcome, the reason ending with it."""
    w = World(tmp_path, inspector=Inspector("damaged", "damaged", "damaged"))

    async def repair(pod: PodInfo, **_: Any) -> None:
        raise NriCniError(message)

    w.plan.repair = repair  # type: ignore[method-assign]

    async def scenario() -> list[PodHealth | None]:
        await w.attached_and_listed()
        await w.svc.timers.verify()
        out = [w.svc.health.get(POD)]
        for _ in range(2):
            await w.svc.timers.verify(POD)
        return out + [w.svc.health.get(POD)]

    first, last = w.run(scenario)
    assert first is None
    assert last is not None and (last.state, last.code) == (PodState.BROKEN, BrokenCode.REPAIR_FAILED)
    assert last.reason.startswith("podnet/eth0: no eth0; repair failed 3 times, the last: ")
    if message:
        assert last.reason.endswith(f"the last: {message} (retried with backoff)")


@pytest.mark.parametrize("cached", [True, False], ids=["runtime-result-cached", "control-none-cached"])
def test_a_repair_in_secondary_mode_runs_the_runtime_networks_finalize_it_lacks(tmp_path, cached):
    """Secondary mode: when the pod was attached the runtime had cached no result of its own
    network (eth0), so that network's FINALIZE was skipped. net1 is then found damaged and
    repaired; by now the runtime's result is cached: the repair's attach runs the runtime
    network's FINALIZE (its plugin e8-fin). Control: still nothing cached -> no FINALIZE."""
    settings = {
        "mode": "secondary",
        "primary_network": "runtimenet",
        "cni": {"runtime_cache_dir": str(tmp_path / "runtime-cache")},
    }
    w = World(tmp_path, inspector=Inspector("damaged"), settings=settings)
    w.fake.plugins["e8-fin"] = {
        "FINALIZE": lambda call: json.dumps(json.loads(call.stdin)["prevResult"]).encode()
    }
    runtimenet = {"cniVersion": "1.1.0", "name": "runtimenet", "plugins": [{"type": "e8-rt"}]}
    runtimenet["finalize_plugins"] = [{"type": "e8-fin"}]
    own = {"cniVersion": "1.1.0", "ips": [{"address": f"{IP}/24"}]}

    async def scenario() -> PodHealth:
        await w.attached_and_listed()
        assert w.fake.commands() == ["ADD"]  # no FINALIZE: nothing of the runtime's cached
        if cached:
            primary = w.svc.verifier.mode.runtime_primary
            assert primary is not None
            entry = CacheEntry(
                POD, "eth0", "runtimenet", json.dumps(runtimenet).encode(), w.pod.netns, result=own
            )
            primary.cache.write(entry)
        (health,) = await w.svc.timers.verify()
        return health

    health = w.run(scenario)
    assert health.state is PodState.REPAIRED
    assert w.fake.commands("e8-fin") == (["FINALIZE"] if cached else [])
