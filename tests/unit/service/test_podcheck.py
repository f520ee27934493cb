"""One pod's round (nri_cni/service/podcheck.py): what it lacks, what is damaged or unknown, the
expectations of its entries and the retry's backoff; the verdict per attachment, the round's
signature and how many CHECKs run at once (service/verify.py)."""

from __future__ import annotations

import asyncio
import os

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.config.model import NetworkSpec
from nri_cni.node import Expectation, Finding, FindingKind
from nri_cni.node.model import Difference
from nri_cni.pod.model import PodInfo
from nri_cni.pod.select import Selected
from nri_cni.service.podcheck import (
    BAD_RESULT,
    NO_RESULT,
    Retry,
    ToRead,
    expectations,
    pod_check,
    read_checks,
)
from nri_cni.service.podstate import AttachmentVerdict
from nri_cni.service.verify import check_parallel, signature, verdicts_of

POD = PodInfo(id="a" * 64, name="web", namespace="ns", netns="/var/run/netns/x")


def entry(net: str, ifname: str, result: dict | None = None) -> CacheEntry:
    return CacheEntry(POD.id, ifname, net, b"{}", result=result)


def selected(net: str, ifname: str) -> Selected:
    return Selected(NetworkSpec(name=net, conflist=None), ifname)


def finding(*kinds: FindingKind) -> Finding:
    return Finding(Expectation("k", POD.netns, "eth0"), tuple(Difference(k, f"{k.value}!") for k in kinds))


@pytest.mark.parametrize(
    "unknown, found, failed, expected",
    [
        (None, None, None, ("ok", "")),
        (None, (), None, ("ok", "")),  # netlink found nothing wrong
        (None, (), "bad", ("check-failed", "bad")),  # but the CHECK failed
        (None, (FindingKind.LINK_DOWN,), "bad", ("link-down", "link-down!")),  # netlink's first
        ((NO_RESULT, "why"), (FindingKind.LINK_DOWN,), "bad", (NO_RESULT, "why")),  # unknown first
    ],
)
def test_verdict_of_an_attachment(unknown, found, failed, expected):
    """Control cases: each row adds one input to the one above it, and the verdict follows it."""
    key = ("net-a", "eth0")
    unknowns = {key: unknown} if unknown is not None else {}
    findings = {key: finding(*found)} if found is not None else {}
    check = pod_check(POD, [entry("net-a", "eth0")], [], findings, unknowns)
    failed_checks = {key: failed} if failed is not None else {}
    assert verdicts_of(check, failed_checks) == [AttachmentVerdict("net-a", "eth0", *expected)]


def test_missing_networks_follow_the_attachments():
    """The pod should have net-a/eth0 and net-b/net1 and has only net-a/eth0 (and net-b on
    another interface, which does not count)."""
    check = pod_check(
        POD,
        [entry("net-a", "eth0"), entry("net-b", "net2")],
        [selected("net-a", "eth0"), selected("net-b", "net1")],
    )
    assert [(s.network.name, s.ifname) for s in check.missing] == [("net-b", "net1")]
    assert verdicts_of(check, {}) == [
        AttachmentVerdict("net-a", "eth0", "ok"),
        AttachmentVerdict("net-b", "net2", "ok"),
        AttachmentVerdict("net-b", "net1", "missing", "not attached"),
    ]


@pytest.mark.parametrize(
    "kinds, damaged, unreadable, gone",
    [
        ((), False, [], False),
        ((FindingKind.LINK_MISSING,), True, [], False),
        ((FindingKind.UNREADABLE,), False, ["net-a/eth0: unreadable!"], False),  # unknown, not damage
        ((FindingKind.UNREADABLE, FindingKind.ADDRESS_MISSING), True, ["net-a/eth0: unreadable!"], False),
        ((FindingKind.NETNS_GONE,), True, [], True),
    ],
)
def test_what_a_finding_makes_of_the_pod(kinds, damaged, unreadable, gone):
    """Control cases: an unreadable difference alone against the same with a real one beside it."""
    e = entry("net-a", "eth0")
    check = pod_check(POD, [e, entry("net-b", "net1")], [], {("net-a", "eth0"): finding(*kinds)})
    assert check.damaged == ([e] if damaged else [])
    assert check.unreadable == unreadable
    assert check.netns_gone is gone


def test_a_gone_path_is_netns_gone_without_a_finding():
    assert not pod_check(POD, [entry("net-a", "eth0")], []).netns_gone
    assert pod_check(POD, [entry("net-a", "eth0")], [], path_gone=True).netns_gone


def test_unknown_attachments_are_unreadable():
    check = pod_check(POD, [entry("net-a", "eth0")], [], {}, {("net-a", "eth0"): (NO_RESULT, "no result")})
    assert check.unreadable == ["net-a/eth0: no result"]


@pytest.mark.parametrize("second", [True, False], ids=["two", "control-one"])
def test_every_unreadable_attachment_is_told(second):
    """An attachment nothing could be compared for and two whose reading failed: one line each,
    none hiding another. Control: one failed reading."""
    entries = [entry("net-a", "eth0"), entry("net-b", "net1"), entry("net-c", "net2")]
    found = {("net-b", "net1"): finding(FindingKind.UNREADABLE)}
    if second:
        found[("net-c", "net2")] = finding(FindingKind.UNREADABLE)
    check = pod_check(POD, entries, [], found, {("net-a", "eth0"): (NO_RESULT, "no result")})
    assert check.unreadable == ["net-a/eth0: no result", "net-b/net1: unreadable!"] + (
        ["net-c/net2: unreadable!"] if second else []
    )


RESULT = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": POD.netns}]}


@pytest.mark.parametrize(
    "result, unknown",
    [
        (None, NO_RESULT),
        ({"cniVersion": "1.1.0", "ips": [{"address": "not an address"}]}, BAD_RESULT),
        (RESULT, None),
    ],
)
def test_expect_compares_only_what_a_result_says(result, unknown):
    """Control case: the entry with a readable result gets an expectation and no unknown."""
    e = entry("net-a", "eth0", result)
    exps, unknowns = expectations(POD, [e], host_side=False)
    if unknown is None:
        assert unknowns == {}
        assert [(x, exp.container_id, exp.netns, exp.ifname) for x, exp in exps] == [
            (e, POD.id, POD.netns, "eth0")
        ]
    else:
        assert unknowns[("net-a", "eth0")][0] == unknown
        assert exps == []


def test_retry_doubles_up_to_the_longest():
    retry = Retry()
    waits = []
    for now in (100.0, 200.0, 300.0, 400.0, 500.0):
        retry.failed(now, first=1.0, longest=5.0)
        waits.append(retry.next_at - now)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert retry.failures == 5


@pytest.mark.parametrize("cpus, expected", [(None, 2), (1, 2), (2, 4), (3, 6), (4, 8), (5, 8)])
def test_check_parallel(monkeypatch, cpus, expected):
    """Control case: (4, 8) against (5, 8): one CPU more stops adding at 8."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert check_parallel() == expected


def test_reasons_say_what_was_not_read():
    from nri_cni.service.podcheck import netns_unreadable, unreadable_reason
    from nri_cni.service.podstate import BrokenCode

    pod = PodInfo(id="a" * 64, name="web", namespace="ns", netns="/var/run/netns/x", pid=4242)
    why, verdicts = netns_unreadable(pod, [entry("net-a", "eth0"), entry("net-b", "net1")])
    assert why == (
        "its netns path /var/run/netns/x is gone or is no network namespace, while its pause "
        "process 4242 runs and the runtime lists it: nri-cni can neither read nor repair its "
        "networks and keeps its IPs held"
    )
    code = BrokenCode.NETNS_UNREADABLE.value
    assert verdicts == [
        AttachmentVerdict("net-a", "eth0", code, why),
        AttachmentVerdict("net-b", "net1", code, why),
    ]

    unknowns = {("net-a", "eth0"): (NO_RESULT, "no result"), ("net-b", "net1"): (BAD_RESULT, "bad result")}
    check = pod_check(POD, [entry("net-a", "eth0"), entry("net-b", "net1")], [], {}, unknowns)
    assert unreadable_reason(check, "remove the pod") == (
        "net-a/eth0: no result; net-b/net1: bad result: not verified, nothing was changed; read "
        "again every round (if it stays: nri-cni pods and the daemon log say what failed; a cache "
        "entry without a usable result cannot be repaired: remove the pod)"
    )


def test_signature_changes_with_a_result():
    """What the round compares before and under the pod's lock. Control case: the same entries
    with one result changed give another signature."""
    a, b = entry("net-a", "eth0", RESULT), entry("net-b", "net1")
    assert signature([a, b]) == [(("net-a", "eth0"), RESULT), (("net-b", "net1"), None)]
    assert signature([a, entry("net-b", "net1", RESULT)]) != signature([a, b])


PORTMAP = (
    b'{"cniVersion":"1.1.0","name":"net-a","plugins":[{"type":"bridge","ipam":{"type":"host-local",'
    b'"dataDir":"/var/lib/cni/networks"}},{"type":"portmap","capabilities":{"portMappings":true}}]}'
)
RESULT_V4 = {**RESULT, "ips": [{"address": "10.0.0.5/24", "interface": 0}]}


def test_expect_adds_what_the_chain_made_on_the_host():
    """By default the host side counts: portmap's DNAT of the pod's hostPort, host-local's lease,
    for the entry's container. Control case: host_side=False leaves them out."""
    e = CacheEntry(
        "c" * 64, "eth0", "net-a", PORTMAP, capability_args={"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        result=RESULT_V4,
    )  # fmt: skip
    (full, unknown), (bare, _) = expectations(POD, [e]), expectations(POD, [e], host_side=False)
    (_, exp), (_, plain) = full[0], bare[0]
    assert unknown == {} and exp.container_id == "c" * 64
    assert [p.port for p in exp.host_ports] == [8080]
    assert [lease.ip for lease in exp.leases] == ["10.0.0.5"]
    assert plain.host_ports == () and plain.leases == () and plain.container_id == "c" * 64


def test_an_unreadable_host_side_still_checks_the_pods_side():
    """Control case: test_expect_adds_what_the_chain_made_on_the_host, the same with a config
    that can be read."""
    e = CacheEntry(POD.id, "eth0", "net-a", b"not json", result=RESULT_V4)
    exps, unknowns = expectations(POD, [e])
    kind, why = unknowns[("net-a", "eth0")]
    assert kind == FindingKind.UNREADABLE.value
    assert why.startswith("what the chain made on the host cannot be told from the cached config: ")
    assert [x for x, _ in exps] == [e]


@pytest.mark.parametrize(
    "path, named", [("", "no file"), ("/cache/results/net-a-x-eth0", "/cache/results/net-a-x-eth0")]
)
@pytest.mark.parametrize(
    "result, unknown, says",
    [
        (None, NO_RESULT, "nri-cni's cache entry ({}) holds no result"),
        ({"ips": "x"}, BAD_RESULT, "the cached result ({}) cannot be read"),
    ],
)
def test_an_entry_nothing_can_be_compared_with_is_named_and_the_next_one_still_checked(
    path, named, result, unknown, says
):
    """The reason names the cache file, or says there is none. Control case: the second entry,
    the same pod with a readable result, gets its expectation."""
    first = CacheEntry(POD.id, "eth0", "net-a", b"{}", result=result, path=path)
    second = entry("net-b", "net1", RESULT)
    exps, unknowns = expectations(POD, [first, second], host_side=False)
    kind, why = unknowns[("net-a", "eth0")]
    assert kind == unknown and why.startswith(says.format(named))
    assert [x for x, _ in exps] == [second]


class CountingInspector:
    def __init__(self) -> None:
        self.calls: list[list[Expectation]] = []

    async def inspect(self, exps):
        self.calls.append(list(exps))
        return [Finding(e) for e in exps]


@pytest.mark.parametrize("gone", [True, False], ids=["path-gone", "control-there"])
def test_a_round_of_pods_whose_netns_is_gone_reads_nothing(gone):
    """Nothing to compare (every pod's netns path gone): no netlink read at all, not even an
    empty one (a round over a node of stopped pods). Control: a pod that is there is read."""
    spy = CountingInspector()
    pod = ToRead(POD, [entry("net-a", "eth0", RESULT)], [], path_gone=gone)
    (c,) = asyncio.run(read_checks(spy, [pod]))  # type: ignore[arg-type]
    assert c.netns_gone is gone
    assert [len(call) for call in spy.calls] == ([] if gone else [1])
