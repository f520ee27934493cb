"""decide() and judge_repair(), the verify round's decision as pure functions (service/decide.py):
one row per outcome, each beside its control row (the same reading with the one thing changed
that must flip the outcome)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.config import NetworkSpec
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.pod.model import PodInfo, PrimaryNetwork
from nri_cni.pod.select import Selected
from nri_cni.service.decide import Policy, Reading, RepairOrder, Verdict, decide, judge_repair
from nri_cni.service.modes import Mode, NativeMode, SecondaryMode, ShimMode
from nri_cni.service.podcheck import PodCheck, Retry
from nri_cni.service.podstate import BrokenCode, PodState
from nri_cni.service.roster import PodRecord

POD = "e8" * 32
IP = "10.88.0.2"
SHIM: Mode = ShimMode(PrimaryNetwork("podnet", ours=True))
NATIVE: Mode = NativeMode(PrimaryNetwork("podnet", ours=True))
SECONDARY: Mode = SecondaryMode(PrimaryNetwork("runtime", ours=False), ResultCache("/nonexistent"))


def entry(ip: str = IP, network: str = "podnet", ifname: str = "eth0") -> CacheEntry:
    result = {"cniVersion": "1.1.0", "ips": [{"address": f"{ip}/24", "interface": 0}]}
    return CacheEntry(POD, ifname, network, b"{}", netns="/n", result=result)


def selected(network: str = "podnet", ifname: str = "eth0") -> Selected:
    return Selected(NetworkSpec(name=network, conflist=None), ifname)


def finding(e: CacheEntry, kind: FindingKind | None = None, why: str = "") -> Finding:
    exp = Expectation(key=f"{POD}/{e.network_name}/{e.ifname}", netns="/n", ifname=e.ifname)
    return Finding(exp, (Difference(kind, why),) if kind else ())


def check(
    *,
    entries: tuple[CacheEntry, ...] = (),
    want: tuple[Selected, ...] = (),
    ips: tuple[str, ...] = (IP,),
    kinds: dict[str, FindingKind] | None = None,
    unknown: bool = False,
    path_gone: bool = False,
) -> PodCheck:
    pod = PodInfo(POD, name="e8", namespace="default", netns="/n", ips=ips)
    c = PodCheck(pod, list(entries), list(want), path_gone=path_gone)
    c.findings = {(e.network_name, e.ifname): finding(e, (kinds or {}).get(e.ifname), "x") for e in entries}
    if unknown:
        c.unknown[("podnet", "eth0")] = ("no-result", "holds no result")
    return c


LISTED = PodRecord(POD, pod=PodInfo(POD, name="e8", namespace="default", netns="/n", ips=(IP,)))
ON = Policy("on", None, 100.0, False)


def run(
    c: PodCheck,
    *,
    record: PodRecord = LISTED,
    mode: Mode = SHIM,
    policy: Policy = ON,
    failed: dict[tuple[str, str], str] | None = None,
    running: bool = True,
) -> Verdict | RepairOrder:
    return decide(Reading(c, failed or {}, running), record, mode, policy)


def outcome(decision: Verdict | RepairOrder) -> tuple[Any, ...]:
    """A decision in a comparable form: ("repair", DELed, asked) or (state, code)."""
    if isinstance(decision, RepairOrder):
        return ("repair", tuple(e.ifname for e in decision.damaged), dict(decision.ips))
    return (decision.state, decision.code)


INTACT = check(entries=(entry(),), want=(selected(),))
DAMAGED = check(entries=(entry(),), want=(selected(),), kinds={"eth0": FindingKind.LINK_MISSING})
OK = (PodState.OK, None)
LEFT = (None, None)
REPAIR_ETH0 = ("repair", ("eth0",), {("podnet", "eth0"): (IP,)})

ROWS: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    # 1 the runtime does not list it (any more): nothing reported | control: listed
    ("not-listed", {"c": INTACT, "record": PodRecord(POD)}, LEFT),
    ("not-listed/control", {"c": INTACT}, OK),
    # 2 torn down while the round read it: never attached again | control: not torn down
    ("stopped", {"c": DAMAGED, "record": dataclasses.replace(LISTED, stopped=True)}, LEFT),
    ("stopped/control", {"c": DAMAGED}, REPAIR_ETH0),
    # 3 its netns path is gone while its pause runs | control: the pause is gone (the reaper's)
    ("netns-gone", {"c": check(entries=(entry(),), path_gone=True)}, (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE)),
    ("netns-gone/control", {"c": check(entries=(entry(),), path_gone=True), "running": False}, LEFT),
    # 4 secondary: listed with IPs, now without (the runtime's own network lost) | control: never had IPs
    (
        "ips-lost",
        {"c": check(entries=(entry(ifname="net1"),), ips=()), "mode": SECONDARY,
         "record": dataclasses.replace(LISTED, ips_lost=True)},
        (PodState.BROKEN, BrokenCode.TORN_DOWN),
    ),
    ("ips-lost/control", {"c": check(entries=(entry(ifname="net1"),), ips=()), "mode": SECONDARY}, OK),
    # 5 nothing differs but something could not be read (its CHECK was due and passed): never ok
    #   | control: everything read
    ("unreadable", {"c": check(entries=(entry(),), want=(selected(),), unknown=True)}, (PodState.BROKEN, BrokenCode.UNREADABLE)),
    ("unreadable/control", {"c": INTACT}, OK),
    # 6 shim: nothing of nri-cni's, no IP the runtime reports: a pod in creation | control: torn
    #   down and listed READY again
    ("in-creation", {"c": check(want=(selected(),), ips=())}, LEFT),
    (
        "in-creation/control",
        {"c": check(want=(selected(),), ips=()), "record": dataclasses.replace(LISTED, relisted=True)},
        (PodState.BROKEN, BrokenCode.TORN_DOWN),
    ),
    # 7 native: a network missing and no IP the runtime lists to give it back: missed | control:
    #   the runtime lists an IP no attachment holds -> re-ADDed with it
    (
        "missed",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1"))), "mode": NATIVE},
        (PodState.BROKEN, BrokenCode.MISSED),
    ),
    (
        "missed/control",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1")), ips=(IP, "10.99.0.7")),
         "mode": NATIVE},
        ("repair", (), {("extra", "net1"): ("10.99.0.7",)}),
    ),
    # 8 repair is not on: reported, nothing changed | control: on
    ("repair-off", {"c": DAMAGED, "policy": Policy("verify-only", None, 100.0, False)}, (PodState.BROKEN, BrokenCode.REPAIR_OFF)),
    ("repair-off/control", {"c": DAMAGED}, REPAIR_ETH0),
    # 9 a failed repair backing off: its last verdict stands | control: asked for by name
    ("backoff", {"c": DAMAGED, "policy": Policy("on", Retry(1, 200.0), 100.0, False)}, LEFT),
    ("backoff/control", {"c": DAMAGED, "policy": Policy("on", Retry(1, 200.0), 100.0, True)}, REPAIR_ETH0),
    # 10 a CHECK failed on what netlink found intact: DEL and ADD it with its IPs | control: it passed
    ("check-failed", {"c": INTACT, "failed": {("podnet", "eth0"): "CHECK: no"}}, REPAIR_ETH0),
    ("check-failed/control", {"c": INTACT}, OK),
    # 11 shim: the runtime's IPs are not eth0's: eth0 cut and asked for the runtime's | control:
    #   the same IPs
    ("ip-mismatch", {"c": check(entries=(entry(),), want=(selected(),), ips=("10.88.0.9",))},
     ("repair", ("eth0",), {("podnet", "eth0"): ("10.88.0.9",)})),
    ("ip-mismatch/control", {"c": INTACT}, OK),
    # 12 shim: a network missing: ADDed, eth0 asking for the runtime's IPs | control: attached
    ("missing", {"c": check(want=(selected(),))}, ("repair", (), {("podnet", "eth0"): (IP,)})),
    ("missing/control", {"c": INTACT}, OK),
]  # fmt: skip


@pytest.mark.parametrize(("case", "kw", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(case, kw, expected):
    kw = dict(kw)
    assert outcome(run(kw.pop("c"), **kw)) == expected


def test_every_row_has_its_control():
    names = [r[0] for r in ROWS]
    assert {n for n in names if not n.endswith("/control")} == {
        n[: -len("/control")] for n in names if n.endswith("/control")
    }


ORDER = RepairOrder((entry(),), {("podnet", "eth0"): (IP,)}, ("podnet/eth0: no eth0",))
JUDGED = [
    # a repair that leaves a network missing is no repair | control: the network is back
    ("left-missing", check(want=(selected(),)), 1, "", (None, None)),
    ("left-missing/control", INTACT, 1, "", (PodState.REPAIRED, None)),
    # still damaged after the repair, the third failure in a row: broken | control: the first
    ("third-failure", DAMAGED, 3, "", (PodState.BROKEN, BrokenCode.REPAIR_FAILED)),
    ("third-failure/control", DAMAGED, 1, "", (None, None)),
    # the repair raised | control: it did not
    ("raised", INTACT, 3, "ADD failed", (PodState.BROKEN, BrokenCode.REPAIR_FAILED)),
    ("raised/control", INTACT, 3, "", (PodState.REPAIRED, None)),
]


@pytest.mark.parametrize(
    ("case", "after", "failures", "error", "expected"), JUDGED, ids=[r[0] for r in JUDGED]
)
def test_judge_repair(case, after, failures, error, expected):
    verdict = judge_repair(after, ORDER, failures, error)
    assert (verdict.state, verdict.code) == expected
    if case == "left-missing":
        assert verdict.stands and "networks missing" in verdict.why
