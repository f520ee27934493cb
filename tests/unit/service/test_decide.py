"""decide() and judge_repair(), the verify round's decision as pure functions (service/decide.py):
one row per outcome, each beside its control row (the same reading with the one thing changed
that must flip the outcome). An outcome is its state and code with what it does to the pod's
retries (ends_retries, settles, stands), and the words it is reported with."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.config import NetworkSpec
from nri_cni.node import Difference, Expectation, Finding, FindingKind
from nri_cni.pod.model import PodInfo, PrimaryNetwork
from nri_cni.pod.select import Selected
from nri_cni.service.decide import (
    ADMIN_ACTION,
    Policy,
    Reading,
    RepairOrder,
    Verdict,
    decide,
    judge_repair,
    missed_reason,
)
from nri_cni.service.modes import Mode, NativeMode, SecondaryMode, ShimMode
from nri_cni.service.podcheck import PodCheck, Retry, pod_check
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
    findings = {e.key: finding(e, (kinds or {}).get(e.ifname), "x") for e in entries}
    unknowns = {("podnet", "eth0"): ("no-result", "holds no result")} if unknown else {}
    return pod_check(pod, entries, want, findings, unknowns, path_gone=path_gone)


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
    return decide(Reading(c, failed or {}, running), record, mode.runtime_ips(c, record), policy)


def flags(v: Verdict) -> frozenset[str]:
    return frozenset(f for f in ("ends_retries", "settles", "stands") if getattr(v, f))


def outcome(decision: Verdict | RepairOrder) -> tuple[Any, ...]:
    """A decision in a comparable form: ("repair", DELed, asked) or (state, code, flags)."""
    if isinstance(decision, RepairOrder):
        return ("repair", tuple(e.ifname for e in decision.damaged), dict(decision.ips))
    return (decision.state, decision.code, flags(decision))


INTACT = check(entries=(entry(),), want=(selected(),))
DAMAGED = check(entries=(entry(),), want=(selected(),), kinds={"eth0": FindingKind.LINK_MISSING})
ENDS, SETTLES, STANDS = "ends_retries", "settles", "stands"
OK = (PodState.OK, None, {ENDS, SETTLES})
LEFT = (None, None, set())
REPAIR_ETH0 = ("repair", ("eth0",), {("podnet", "eth0"): (IP,)})

ROWS: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    # 1 the runtime does not list it (any more): nothing reported | control: listed
    ("not-listed", {"c": INTACT, "record": PodRecord(POD)}, LEFT),
    ("not-listed/control", {"c": INTACT}, OK),
    # 2 torn down while the round read it: never attached again | control: not torn down
    ("stopped", {"c": DAMAGED, "record": dataclasses.replace(LISTED, stopped=True)}, LEFT),
    ("stopped/control", {"c": DAMAGED}, REPAIR_ETH0),
    # 3 its netns path is gone while its pause runs | control: the pause is gone (the reaper's)
    ("netns-gone", {"c": check(entries=(entry(),), path_gone=True)}, (PodState.BROKEN, BrokenCode.NETNS_UNREADABLE, {ENDS})),
    ("netns-gone/control", {"c": check(entries=(entry(),), path_gone=True), "running": False}, LEFT),
    # 4 secondary: listed with IPs, now without (the runtime's own network lost) | control: never had IPs
    (
        "ips-lost",
        {"c": check(entries=(entry(ifname="net1"),), ips=()), "mode": SECONDARY,
         "record": dataclasses.replace(LISTED, ips_lost=True)},
        (PodState.BROKEN, BrokenCode.TORN_DOWN, {ENDS}),
    ),
    ("ips-lost/control", {"c": check(entries=(entry(ifname="net1"),), ips=()), "mode": SECONDARY}, OK),
    # 5 nothing differs but something could not be read (its CHECK was due and passed): never ok
    #   | control: everything read
    ("unreadable", {"c": check(entries=(entry(),), want=(selected(),), unknown=True)},
     (PodState.BROKEN, BrokenCode.UNREADABLE, {ENDS, SETTLES})),
    ("unreadable/control", {"c": INTACT}, OK),
    # 6 shim: nothing of nri-cni's, no IP the runtime reports: a pod in creation | control: torn
    #   down and listed READY again
    ("in-creation", {"c": check(want=(selected(), selected("extra", "net1")), ips=())}, LEFT),
    (
        "in-creation/control",
        {"c": check(want=(selected(), selected("extra", "net1")), ips=()),
         "record": dataclasses.replace(LISTED, relisted=True)},
        (PodState.BROKEN, BrokenCode.TORN_DOWN, set()),
    ),
    # shim: nri-cni's attachment damaged and no IP the runtime reports: repaired with its own
    #   IPs | control: no attachment of nri-cni's (a pod in creation)
    ("held-no-ips", {"c": check(entries=(entry(),), want=(selected(),), ips=(), kinds={"eth0": FindingKind.LINK_MISSING})},
     ("repair", ("eth0",), {("podnet", "eth0"): (f"{IP}/24",)})),
    ("held-no-ips/control", {"c": check(want=(selected(),), ips=())}, LEFT),
    # 7 native: a network missing and no IP the runtime lists to give it back: missed | control:
    #   the runtime lists an IP no attachment holds -> re-ADDed with it
    (
        "missed",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1"))), "mode": NATIVE},
        (PodState.BROKEN, BrokenCode.MISSED, {SETTLES}),
    ),
    (
        "missed/control",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1")), ips=(IP, "10.99.0.7")),
         "mode": NATIVE},
        ("repair", (), {("extra", "net1"): ("10.99.0.7",)}),
    ),
    # native: the runtime did not take nri-cni's IPs (nothing missing): missed | control: it did
    ("not-taken", {"c": check(entries=(entry(),), want=(selected(),), ips=("10.88.0.9",)), "mode": NATIVE},
     (PodState.BROKEN, BrokenCode.MISSED, {SETTLES})),
    ("not-taken/control", {"c": INTACT, "mode": NATIVE}, OK),
    # native: not taken and a network missing: missed, the runtime's IP is not that network's |
    #   control: the runtime took eth0's and lists one more (re-ADDed with it)
    (
        "not-taken-missing",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1")), ips=("10.99.0.7",)),
         "mode": NATIVE},
        (PodState.BROKEN, BrokenCode.MISSED, {SETTLES}),
    ),
    (
        "not-taken-missing/control",
        {"c": check(entries=(entry(),), want=(selected(), selected("extra", "net1")), ips=(IP, "10.99.0.7")),
         "mode": NATIVE},
        ("repair", (), {("extra", "net1"): ("10.99.0.7",)}),
    ),
    # 8 repair is not on: reported, nothing changed | control: on
    ("repair-off", {"c": DAMAGED, "policy": Policy("verify-only", None, 100.0, False)},
     (PodState.BROKEN, BrokenCode.REPAIR_OFF, set())),
    ("repair-off/control", {"c": DAMAGED}, REPAIR_ETH0),
    # 9 a failed repair backing off: its last verdict stands | control: asked for by name
    ("backoff", {"c": DAMAGED, "policy": Policy("on", Retry(1, 200.0), 100.0, False)}, (None, None, {STANDS})),
    ("backoff/control", {"c": DAMAGED, "policy": Policy("on", Retry(1, 200.0), 100.0, True)}, REPAIR_ETH0),
    # the backoff is over at its next try's time | control: a moment before it
    ("backoff-over", {"c": DAMAGED, "policy": Policy("on", Retry(1, 100.0), 100.0, False)}, REPAIR_ETH0),
    ("backoff-over/control", {"c": DAMAGED, "policy": Policy("on", Retry(1, 100.5), 100.0, False)},
     (None, None, {STANDS})),
    # a retried repair asks again for the IPs it asked for before | control: none asked before
    (
        "retry-ips",
        {"c": DAMAGED, "policy": Policy("on", Retry(1, 50.0, {("extra", "net1"): ("10.99.0.7",)}), 100.0, False)},
        ("repair", ("eth0",), {("podnet", "eth0"): (IP,), ("extra", "net1"): ("10.99.0.7",)}),
    ),
    ("retry-ips/control", {"c": DAMAGED, "policy": Policy("on", Retry(1, 50.0), 100.0, False)}, REPAIR_ETH0),
    # a damaged network that is not the primary asks for its own IPs | control: it is intact
    (
        "damaged-second",
        {"c": check(entries=(entry(), entry("10.99.0.7", "extra", "net1")), want=(selected(), selected("extra", "net1")),
                    kinds={"net1": FindingKind.LINK_MISSING})},
        ("repair", ("net1",), {("podnet", "eth0"): (IP,), ("extra", "net1"): ("10.99.0.7/24",)}),
    ),
    (
        "damaged-second/control",
        {"c": check(entries=(entry(), entry("10.99.0.7", "extra", "net1")), want=(selected(), selected("extra", "net1")))},
        OK,
    ),
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
    got = outcome(run(kw.pop("c"), **kw))
    if got[0] != "repair":
        got = (*got[:2], set(got[2]))
    assert got == expected


# What a verdict row is reported with: its reason (a state) or why nothing is (None); each
# row's words differ from its control's, so the table's controls hold here too.
WORDS: dict[str, Any] = {
    "not-listed": "not listed by the runtime",
    "stopped": "torn down while the round read it: never attached again",
    "netns-gone": lambda t: t.startswith("its netns path /n is gone") and t.endswith(f"; {ADMIN_ACTION}"),
    "netns-gone/control": "its netns is gone and its pause process too: the reaper's",
    "ips-lost": lambda t: (
        t.startswith("the runtime reports no IP for it") and t.endswith(f"; {ADMIN_ACTION}")
    ),
    "unreadable": lambda t: (
        t.startswith("podnet/eth0: holds no result: not verified")
        and t.endswith(f"cannot be repaired: {ADMIN_ACTION})")
    ),
    "in-creation": "nothing of nri-cni's and no IP the runtime reports: nothing to make true",
    "in-creation/control": "podnet/eth0: not attached; extra/net1: not attached: the runtime deleted its "
    "network and, restarted, lists it READY without an IP; stop or delete the pod",
    "missed": f"missed: it lacks extra/net1, and the runtime learns IPs only from RunPodSandbox; {ADMIN_ACTION}",
    "not-taken": "missed: the runtime did not take nri-cni's answer (the runtime reports 10.88.0.9; nri-cni "
    f"gave it {IP}): past the NRI deadline or killed; {ADMIN_ACTION}",
    "repair-off": "podnet/eth0: x (repair is verify-only: nothing was changed)",
    "backoff": "backing off after a failed repair",
}


@pytest.mark.parametrize("case", sorted(WORDS))
def test_decide_words(case):
    kw = dict(next(r[1] for r in ROWS if r[0] == case))
    v = run(kw.pop("c"), **kw)
    assert isinstance(v, Verdict)
    text = v.reason if v.state is not None else v.why
    want = WORDS[case]
    assert want(text) if callable(want) else text == want, text


def test_every_row_has_its_control():
    names = [r[0] for r in ROWS]
    assert {n for n in names if not n.endswith("/control")} == {
        n[: -len("/control")] for n in names if n.endswith("/control")
    }


ORDER = RepairOrder((entry(),), {("podnet", "eth0"): (IP,)}, ("podnet/eth0: no eth0",))
JUDGED = [
    # a repair that leaves a network missing is no repair | control: the network is back
    ("left-missing", check(want=(selected(),)), 1, "", (None, None, {STANDS})),
    ("left-missing/control", INTACT, 1, "", (PodState.REPAIRED, None, {ENDS, SETTLES})),
    # still damaged after the repair, the third failure in a row: broken | control: the first
    ("third-failure", DAMAGED, 3, "", (PodState.BROKEN, BrokenCode.REPAIR_FAILED, set())),
    ("third-failure/control", DAMAGED, 1, "", (None, None, {STANDS})),
    # the repair raised | control: it did not
    ("raised", INTACT, 3, "ADD failed", (PodState.BROKEN, BrokenCode.REPAIR_FAILED, set())),
    ("raised/control", INTACT, 3, "", (PodState.REPAIRED, None, {ENDS, SETTLES})),
]


@pytest.mark.parametrize(
    ("case", "after", "failures", "error", "expected"), JUDGED, ids=[r[0] for r in JUDGED]
)
def test_judge_repair(case, after, failures, error, expected):
    verdict = judge_repair(after, ORDER, failures, error)
    assert (verdict.state, verdict.code, set(flags(verdict))) == expected


def test_a_repair_judged_without_an_error_is_repaired_with_what_it_made_true():
    # control: test_judge_repair's "raised" (an error given)
    verdict = judge_repair(INTACT, ORDER, 1)
    assert (verdict.state, verdict.reason) == (PodState.REPAIRED, "podnet/eth0: no eth0")


def test_a_repair_that_left_differences_says_which():
    both = (entry(), entry("10.99.0.7", "extra", "net1"))
    want = (selected(), selected("extra", "net1"))
    damaged = check(
        entries=both, want=want, kinds={"eth0": FindingKind.LINK_MISSING, "net1": FindingKind.LINK_MISSING}
    )
    assert (
        judge_repair(damaged, ORDER, 1).why
        == "repair failed (try 1 of 3): still differs after the repair: x; x"
    )
    # control: nothing damaged, a network missing
    missing = check(entries=both[:1], want=want)
    assert judge_repair(missing, ORDER, 1).why == (
        "repair failed (try 1 of 3): still differs after the repair: networks missing"
    )


NO_NET = "the runtime created it without nri-cni's answer (nri-cni was down or killed, or answered past the NRI request timeout) and nri-cni holds no network of it"
FAILED_KEPT = "its attach failed in RunPodSandbox and the runtime kept the pod without networks"
NOTHING = check(want=(selected(),))  # nothing of nri-cni's attached
INTACT_NET1 = check(  # eth0 attached, net1 and net2 missing
    entries=(entry(),), want=(selected(), selected("fastnet", "net1"), selected("slownet", "net2"))
)
MISSED_ROWS = [
    # the answer came past the deadline and nothing is attached: the late reason itself
    (
        "late-nothing",
        {"late": "answered 3 s past the deadline"},
        NOTHING,
        "",
        "answered 3 s past the deadline",
    ),
    # late, but something is attached: not the late reason (what is missing is named)
    (
        "late-something",
        {"late": "answered late"},
        INTACT_NET1,
        "",
        "it lacks fastnet/net1, slownet/net2, and the runtime learns IPs only from RunPodSandbox",
    ),
    # nothing attached after a failed attach | control: the same without the failure
    ("failed-nothing", {"attach_failed": True}, NOTHING, "", FAILED_KEPT),
    ("control-not-failed", {}, NOTHING, "", NO_NET),
    # something attached after a failed attach: the failure is not the reason
    (
        "failed-something",
        {"attach_failed": True},
        INTACT_NET1,
        "",
        "it lacks fastnet/net1, slownet/net2, and the runtime learns IPs only from RunPodSandbox",
    ),
    # attached, but the runtime's IPs differ from the answer
    (
        "mismatch",
        {},
        INTACT_NET1,
        "IPs 10.88.0.9",
        "the runtime did not take nri-cni's answer (IPs 10.88.0.9): past the NRI deadline or killed",
    ),
]


@pytest.mark.parametrize(
    ("record", "c", "mismatch", "why"), [r[1:] for r in MISSED_ROWS], ids=[r[0] for r in MISSED_ROWS]
)
def test_why_a_native_pod_is_missed(record, c, mismatch, why):
    """The reason an admin reads for a native pod the runtime created without nri-cni's networks,
    in the order the causes are told apart; each row with the one input that flips it."""
    assert missed_reason(PodRecord(POD, **record), c, mismatch, "do this") == f"missed: {why}; do this"
