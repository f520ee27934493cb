"""A verify round's outcomes through its entry point (ServiceTimers.verify): which pod a round
is asked about, how failed repairs back off, what a repair that must not touch the pod reports.
Each test states its control case: the same round with the one input changed that flips the
outcome. Without root: the plugins are the fake executor's, the node inspector a fake."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.plugin_process import PLUGIN_NICE
from nri_cni.errors import Kind, NriCniError
from nri_cni.service.podstate import BrokenCode, PodHealth, PodState
from tests.support import verifyworld

POD, OTHER = "e5" * 32, "e6" * 32
IP = "10.78.0.2"
ASKABLE = {"type": "e5-br", "capabilities": {"ips": True}}  # a repair can ask it for IP again
UNASKABLE = {"type": "e5-br"}  # no `ips` capability, no IPAM that reads args.cni.ips
BUSY = Ended(stdout=b'{"cniVersion":"1.1.0","code":11,"msg":"busy"}', status=1)


def _refusal(address: str) -> Ended:
    msg = f"requested IP address {address} is not available in range set"
    return Ended(stdout=json.dumps({"cniVersion": "1.1.0", "code": 999, "msg": msg}).encode(), status=1)


def World(tmp: Path, **kw: Any) -> verifyworld.World:
    return verifyworld.World(tmp, tag="e5", ip=IP, **kw)


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "control-listed"])
def test_a_round_asked_about_one_pod_the_runtime_does_not_list_is_refused(tmp_path, listed):
    """`nri-cni verify POD` of a pod the runtime's list lacks: a usage error naming the pod,
    and no verdict. Control: the same pod listed -> its verdict (ok)."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth]:
        await w.svc.verbs.attach(w.pod)
        if listed:
            w.svc.roster.listed([w.pod])
        return await w.svc.timers.verify(POD)

    if listed:
        (health,) = w.run(scenario)
        assert health.state is PodState.OK
    else:
        with pytest.raises(NriCniError, match=f"no pod '{POD}' in the runtime's pod list") as err:
            w.run(scenario)
        assert err.value.kind is Kind.BAD_ENV
        assert w.svc.health.get(POD) is None


@pytest.mark.parametrize(
    "interval, gaps",
    [
        # the longest wait: 16 verify intervals (4 s); 1, 2, 4, then at most 4
        ("250ms", [1.0, 2.0, 4.0, 4.0, 4.0]),
        # the timer off (0): as at the default 30 s, 480 s
        (0, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 480.0, 480.0]),
    ],
)
def test_failed_repairs_are_tried_again_after_a_doubling_wait_up_to_16_intervals(tmp_path, interval, gaps):
    """eth0 is found damaged; each repair's ADD fails. A timer round before the wait since the
    last failure is over tries nothing (the pod's verdict stands); the round at the end of the
    wait tries again. Control: each row's round just before against the one at the end."""
    w = World(tmp_path, verify={"interval": interval})
    now = [100.0]
    w.svc.verifier.clock = lambda: now[0]

    async def tries() -> list[tuple[float, bool]]:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"]  # the round's read
        w.add_answer = BUSY
        before = w.adds()
        await w.svc.timers.verify()  # the first repair: fails
        seen = [(0.0, w.adds() > before)]
        for gap in gaps:
            for at in (now[0] + gap - 0.001, now[0] + gap):
                now[0] = at
                before = w.adds()
                await w.svc.timers.verify()
                seen.append((gap, w.adds() > before))
        return seen

    expected = [(0.0, True)] + [(gap, tried) for gap in gaps for tried in (False, True)]
    assert w.run(tries) == expected
    last = w.svc.health.get(POD)
    assert last is not None and (last.state, last.code) == (PodState.BROKEN, BrokenCode.REPAIR_FAILED)


@pytest.mark.parametrize(
    "holder_ip, state, code",
    [
        (IP, PodState.BROKEN, BrokenCode.IP_TAKEN),  # another pod holds the IP: never taken
        ("10.78.0.3", PodState.REPAIRED, None),  # control: another address -> repaired
    ],
)
def test_a_repair_never_takes_an_address_another_pod_holds(tmp_path, holder_ip, state, code):
    """eth0 found damaged, its IP now in another pod's cached result: the repair touches nothing
    (no DEL, no ADD) and the pod is broken ip-taken, naming the holder. Control: the other pod
    holds another address -> DEL and ADD, repaired."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.other_pod_holds(OTHER, holder_ip)
        w.inspector.answers = ["damaged"]  # the round's read
        return await w.svc.timers.verify()

    (health,) = w.run(scenario)
    assert (health.state, health.code) == (state, code)
    # each attachment's verdict: as read before a repair that did nothing, as read after one
    seen = [(a.network, a.ifname, a.finding) for a in health.attachments]
    if code is BrokenCode.IP_TAKEN:
        assert w.fake.commands() == ["ADD", "CHECK"]
        assert f"its address {IP} now belongs to pod {OTHER[:12]}: never taken" in health.reason
        assert seen == [("podnet", "eth0", "link-missing")]
    else:
        assert w.fake.commands() == ["ADD", "CHECK", "DEL", "ADD"]
        assert seen == [("podnet", "eth0", "ok")]


@pytest.mark.parametrize(
    "add, code",
    [
        (_refusal(IP), BrokenCode.IP_TAKEN),  # the IPAM refuses the address asked for
        (_refusal("10.78.0.3"), BrokenCode.REPAIR_FAILED),  # control: it names another address
    ],
)
def test_an_ipam_that_refuses_the_pods_address_makes_it_ip_taken_at_once(tmp_path, add, code):
    """The repair's ADD fails; its error says the IPAM will not give the address asked for:
    broken ip-taken on the first try. Control: the same refusal of an address not asked for
    is an ordinary failure, retried (no verdict yet) and broken repair-failed on the third."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth | None]:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"]  # the round's read
        w.add_answer = add
        await w.svc.timers.verify()
        seen = [w.svc.health.get(POD)]
        for _ in range(2):  # explicit rounds: no backoff wait
            await w.svc.timers.verify(POD)
        return seen + [w.svc.health.get(POD)]

    first, last = w.run(scenario)
    assert last is not None and (last.state, last.code) == (PodState.BROKEN, code)
    if code is BrokenCode.IP_TAKEN:
        assert first is not None and first.code is BrokenCode.IP_TAKEN
        assert f"the IPAM refused its address {IP}" in first.reason
    else:
        assert first is None


@pytest.mark.parametrize(
    "plugin, state, code",
    [
        (UNASKABLE, PodState.BROKEN, BrokenCode.IPS_NOT_REQUESTABLE),
        (ASKABLE, PodState.REPAIRED, None),  # control: the chain takes the `ips` capability
    ],
)
def test_a_chain_that_cannot_be_asked_for_the_pods_address_is_not_cut(tmp_path, plugin, state, code):
    """eth0 found damaged, and no plugin of its chain can be asked for its IP: nothing is
    DELed (a new ADD would give other IPs), broken ips-not-requestable. Control: the same
    chain with the `ips` capability -> DEL and ADD, repaired."""
    w = World(tmp_path, plugin=plugin)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"]  # the round's read
        return await w.svc.timers.verify()

    (health,) = w.run(scenario)
    assert (health.state, health.code) == (state, code)
    repaired = ["DEL", "ADD"] if state is PodState.REPAIRED else []
    assert w.fake.commands() == ["ADD", "CHECK", *repaired]


@pytest.mark.parametrize("case", ["control-listed", "busy", "stopped", "no-netns"])
def test_a_round_reads_the_listed_pods_with_a_netns_but_not_those_busy_or_torn_down(tmp_path, case):
    """A timer round reads (netlink) and judges each pod the runtime lists with a netns; not one
    an operation holds (the next round's), not one torn down, not one without a netns. Control:
    the listed pod, its lock free -> read, ok. Each other row changes one thing of it."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        if case == "stopped":
            w.svc.roster.stopped(POD)
        if case == "no-netns":
            w.svc.roster.listed([dataclasses.replace(w.pod, netns="")])
        if case != "busy":
            return await w.svc.timers.verify()
        holding, release = asyncio.Event(), asyncio.Event()

        async def operation() -> None:
            async with w.svc.locks.pod(POD):
                holding.set()
                await release.wait()

        op = asyncio.create_task(operation())
        await holding.wait()
        try:
            return await w.svc.timers.verify()
        finally:
            release.set()
            await op

    verdicts = w.run(scenario)
    if case == "control-listed":
        assert [h.state for h in verdicts] == [PodState.OK] and w.inspector.asked == [POD]
    else:
        assert verdicts == [] and w.inspector.asked == [] and w.svc.health.get(POD) is None


@pytest.mark.parametrize("pod_id, rounds", [(None, 1), (POD, 0)], ids=["every-pod", "one-pod"])
def test_only_a_round_over_every_pod_counts_as_a_round_done(tmp_path, pod_id, rounds):
    """`nri-cni status` says verified after a round over every pod. Control: the same pod
    verified by name -> its verdict, and no round done."""
    w = World(tmp_path)

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        return await w.svc.timers.verify(pod_id)

    assert [h.state for h in w.run(scenario)] == [PodState.OK]
    assert w.svc.health.rounds == rounds


@pytest.mark.parametrize(
    "damaged, nice", [(True, 0), (False, 10)], ids=["damaged-first", "intact-check-after-the-round"]
)
def test_a_check_of_an_intact_pod_runs_at_gcs_nice_value(tmp_path, damaged, nice):
    """A forced CHECK (`nri-cni verify --check`): a pod netlink found intact is CHECKed after
    the round, its plugins at GC's nice value (pod operations first). Control: the same pod
    found damaged is CHECKed in the round itself, at the daemon's own (0)."""
    w = World(tmp_path)
    seen: list[int | None] = []

    def check(call) -> bytes:
        seen.append(PLUGIN_NICE.get())
        return b""

    w.fake.plugins["e5-br"] = {"ADD": w._add, "CHECK": check}

    async def scenario() -> list[PodHealth]:
        await w.attached_and_listed()
        w.inspector.answers = ["damaged"] * int(damaged)
        return await w.svc.timers.verify(check=True)

    w.run(scenario)
    assert seen == [nice]
