"""The repair verb (nri_cni/pod/repair.py, Repairer) driven as verify drives it: what a repair
DELs and ADDs and what its op record says, and the CNI CHECK of one cached attachment ("" when
it passes or the chain has no CHECK, else the plugin's error). In-process plugins
(FakeExecutor); no root."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from nri_cni.errors import ConfigError
from nri_cni.pod.model import AttachRequest, PodInfo, RuntimePrimary
from nri_cni.pod.oprecord import OperationLog, OpRecord
from nri_cni.pod.repair import IpTaken, Repairer, repair_selection
from nri_cni.service.modes import mode_for
from tests.support.pods import pod_plan

POD = "c7" * 32
RESULT = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "lo", "mac": "aa:bb:cc:dd:ee:ff"}],  # a host-side link: its MAC as now
    "ips": [{"address": "10.79.0.2/24"}],
}
# a network namespace any user can name: the pod's path of now, where the cache has another
NETNS_NOW = "/proc/self/ns/net"


def _error(code: int, msg: str) -> Ended:
    return Ended(stdout=json.dumps({"cniVersion": "1.1.0", "code": code, "msg": msg}).encode(), status=1)


def _check(tmp_path, version: str, check: Ended | bytes, *, netns: str = "/run/netns/given", **conf):
    """check_entry of one attachment made with `version` whose plugin answers CHECK with `check`:
    what it returns, and the CNI_NETNS of each plugin call."""
    fake = FakeExecutor({"c7-br": {"CHECK": check}})
    cfg = parse_config({"state_dir": str(tmp_path / "state")})
    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake))
    conflist = {"cniVersion": version, "name": "podnet", "plugins": [{"type": "c7-br"}], **conf}
    entry = CacheEntry(
        POD, "eth0", "podnet", json.dumps(conflist).encode(), "/run/netns/cached", result=RESULT
    )
    plan.cni.cache.write(entry)
    said = asyncio.run(plan.check_entry(entry, netns))
    checks = [c for c in fake.calls if c.command == "CHECK"]
    # the prevResult each CHECK got: the host-side link with the MAC it has now (the loopback's)
    assert all(
        json.loads(c.stdin)["prevResult"]["interfaces"][0]["mac"] == "00:00:00:00:00:00" for c in checks
    )
    return said, [c.env["CNI_NETNS"] for c in checks]


@pytest.mark.parametrize(
    "version, check, conf, said, checked",
    [
        ("1.1.0", b"", {}, "", True),  # passes
        ("1.1.0", _error(11, "busy"), {}, "busy", True),  # control: the plugin says no
        ("0.3.1", b"", {}, "", False),  # no CHECK before 0.4.0: nothing to learn
        ("0.4.0", b"", {}, "", True),  # control: the first version with CHECK
        # the plugin's own "incompatible version" (code 1) is its answer, not the runtime's
        # refusal; code 2 likewise
        ("1.1.0", _error(1, "no CHECK here"), {}, "no CHECK here", True),
        ("1.1.0", _error(2, "no CHECK here"), {}, "no CHECK here", True),
        ("1.1.0", _error(11, "busy"), {"disableCheck": True}, "", False),  # switched off
    ],
)
def test_check_entry(tmp_path, version, check, conf, said, checked):
    """Control cases: the second row against the first (the plugin's answer), the third against
    the fourth (the version), the fifth and sixth against the third (code 1 or 2 from a plugin,
    not the runtime's version check), the last against the second (disableCheck)."""
    out, calls = _check(tmp_path, version, check, **conf)
    assert (said in out) if said else (out == "")
    assert calls == (["/run/netns/given"] if checked else [])


@pytest.mark.parametrize("given, used", [("", "/run/netns/cached"), ("/run/netns/given", "/run/netns/given")])
def test_check_entry_runs_in_the_given_netns_else_the_cached_one(tmp_path, given, used):
    """Control case: the second row (a path given) against the first (none)."""
    assert _check(tmp_path, "1.1.0", b"", netns=given) == ("", [used])


class Records:
    """An OperationSink keeping the op records."""

    def __init__(self) -> None:
        self.ops: list[OpRecord] = []

    def observe_operation(self, record: OpRecord) -> None:
        self.ops.append(record)

    def observe_gc(self, report) -> None:
        return None


def _net(name: str) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": name,
        "plugins": [{"type": "c7-br", "capabilities": {"ips": True}}],
    }


@pytest.mark.parametrize("held_by_other", [False, True], ids=["repaired", "control-ip-taken"])
def test_a_repair_dels_the_damaged_last_attached_first_adds_them_back_and_says_so(tmp_path, held_by_other):
    """A pod with eth0 and net1, both damaged: the repair DELs net1 then eth0 (the reverse of
    the attach order), ADDs both asking for their addresses, and its op record says what was
    wrong, what was asked and each step (its plugin calls too), in the pod's netns of now, the
    ADDs asking for the addresses. Control: eth0's address held by another pod -> the
    repair touches nothing (IpTaken), its record says so, with no step."""

    def add(call) -> bytes:
        n = 2 if call.env["CNI_IFNAME"] == "eth0" else 3
        return json.dumps({"cniVersion": "1.1.0", "ips": [{"address": f"10.79.0.{n}/24"}]}).encode()

    fake = FakeExecutor({"c7-br": {"ADD": add}})
    doc = {
        "state_dir": str(tmp_path / "state"),
        "networks": [
            {"name": "podnet", "default": True, "conflist": _net("podnet")},
            {"name": "second", "default": True, "conflist": _net("second")},
        ],
    }
    cfg = parse_config(doc, str(tmp_path / "config.yaml"))
    records = Records()
    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake), sink=records)
    pod = PodInfo(POD, name="c7-pod", namespace="default", netns="/run/netns/c7")
    primary = mode_for(cfg).primary

    async def scenario() -> None:
        await plan.attach(pod, plan.select(pod, primary, AttachRequest()), AttachRequest())
        if held_by_other:
            other = CacheEntry("c8" * 32, "eth0", "podnet", b"{}", "/x", result=RESULT)  # 10.79.0.2
            plan.cni.cache.write(other)
        entries = plan.cached(POD)
        ips = {e.key: tuple(ip["address"] for ip in e.result["ips"]) for e in entries}
        keys = [e.key for e in entries]
        selected = repair_selection(plan.expected(pod, primary), entries, keys)
        fake.calls.clear()
        now = dataclasses.replace(pod, netns=NETNS_NOW)
        await plan.repair(now, selected=selected, damaged=entries, ips=ips, wrong=["both damaged"])

    if held_by_other:
        with pytest.raises(IpTaken):
            asyncio.run(scenario())
    else:
        asyncio.run(scenario())
    record = records.ops[-1]
    assert record.op == "repair"
    assert record.extra == {
        "wrong": ["both damaged"],
        "asked": {"podnet/eth0": ["10.79.0.2/24"], "second/net1": ["10.79.0.3/24"]},
    }
    steps = [(n["network"], n["ifname"], n["op"]) for n in record.networks]
    calls = [(c.command, c.env["CNI_IFNAME"]) for c in fake.calls]
    if held_by_other:
        assert isinstance(record.error, IpTaken) and steps == [] and calls == []
    else:
        assert record.error is None
        assert steps[:2] == [("second", "net1", "del"), ("podnet", "eth0", "del")]
        assert calls[:2] == [("DEL", "net1"), ("DEL", "eth0")]
        assert sorted(c for c in calls if c[0] == "ADD") == [("ADD", "eth0"), ("ADD", "net1")]
        assert all("at" in n and "ms" in n for n in record.networks)  # each step timed
        assert {(c.command, c.env["CNI_NETNS"]) for c in fake.calls} == {
            ("DEL", NETNS_NOW),
            ("ADD", NETNS_NOW),
        }
        assert [(p["command"], p["network"]) for p in record.plugins][:2] == [
            ("DEL", "second"),
            ("DEL", "podnet"),
        ]
        asked = {
            c.env["CNI_IFNAME"]: json.loads(c.stdin)["runtimeConfig"]["ips"]
            for c in fake.calls
            if c.command == "ADD"
        }
        assert asked == {"eth0": ["10.79.0.2/24"], "net1": ["10.79.0.3/24"]}


@pytest.mark.parametrize("value, said", [("v;x", "must not contain"), ("v", "")], ids=["refused", "control"])
def test_check_entry_answers_the_runtimes_refusal_of_a_cached_attachment(tmp_path, value, said):
    """A cached attachment whose CNI_ARGS the runtime refuses to pass on (';' in a value): the
    CHECK answers the refusal's text, the plugin is never run. Control: a plain value passes."""
    fake = FakeExecutor({"c7-br": {"CHECK": b""}})
    cfg = parse_config({"state_dir": str(tmp_path / "state")})
    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake))
    conflist = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "c7-br"}]}
    entry = CacheEntry(POD, "eth0", "podnet", json.dumps(conflist).encode(), "/run/netns/c7", [("K", value)])
    out = asyncio.run(plan.check_entry(entry, ""))
    assert (said in out and "'v;x'" in out) if said else out == ""
    assert [c.command for c in fake.calls] == ([] if said else ["CHECK"])


BAD = b'{"cniVersion": "1.1.0", "name": "podnet", "plugins": []}'  # no plugins: not a conflist


@pytest.mark.parametrize("config", [BAD, json.dumps(_net("podnet")).encode()], ids=["corrupt", "control"])
def test_a_cached_config_that_is_no_conflist_is_named_by_its_cache_file(tmp_path, config):
    """The cache file's config is what CHECK and a repair run: one that is not a conflist is
    refused naming that file ("cache:<path>"), in check_entry and in the repair's selection
    (with the network still configured, and gone from the config). Control: a valid config."""
    doc = {
        "state_dir": str(tmp_path / "state"),
        "networks": [{"name": "podnet", "default": True, "conflist": _net("podnet")}],
    }
    cfg = parse_config(doc, str(tmp_path / "config.yaml"))
    fake = FakeExecutor({"c7-br": {"CHECK": b""}})
    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake))
    path = "/var/lib/cni/results/podnet-c7-eth0"
    entry = CacheEntry(POD, "eth0", "podnet", config, "/run/netns/c7", result=RESULT, path=path)
    configured = plan.expected(PodInfo(POD, netns="/run/netns/c7"), mode_for(cfg).primary)
    assert [sel.key for sel in configured] == [entry.key]
    calls = [
        lambda: asyncio.run(plan.check_entry(entry, "")),
        lambda: repair_selection(configured, [entry], []),  # configured: its cached config
        lambda: repair_selection([], [entry], [entry.key]),  # gone from the config
    ]
    for call in calls:
        if config is BAD:
            with pytest.raises(ConfigError) as err:
                call()
            assert err.value.location == f"cache:{path}"
        else:
            call()


class Attacher:
    """The repair's attacher: records the runtime primary each attach got."""

    def __init__(self) -> None:
        self.primaries: list[object] = []

    async def attach(self, pod, selected, request, record, runtime_primary):
        self.primaries.append(runtime_primary)
        return None


@pytest.mark.parametrize("given", [True, False], ids=["given", "control-none"])
def test_a_repair_attaches_with_the_runtime_primary_it_was_given(tmp_path, given):
    """Secondary mode's runtime primary (whose FINALIZE the repair's attach runs) reaches the
    attach. Control: none given -> none passed."""
    cni = CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=FakeExecutor({}))
    attacher = Attacher()
    repairer = Repairer(cni, rollback=None, attacher=attacher, oplog=OperationLog(Records()))  # type: ignore[arg-type]
    primary = RuntimePrimary("runtime-net", cni.cache) if given else None
    pod = PodInfo(POD, name="c7-pod", namespace="default", netns="/run/netns/c7")
    asyncio.run(repairer.repair(pod, selected=[], damaged=[], ips={}, wrong=[], runtime_primary=primary))
    assert attacher.primaries == [primary]


@pytest.mark.parametrize("on_disk", [True, False], ids=["control-same-on-disk", "file-changed-since"])
def test_check_entry_checks_the_entry_it_was_given(tmp_path, on_disk):
    """The CHECK's prevResult is the result of the entry the round read, not the file read
    again: a file changed since (another address) does not decide it. Control: the same file."""
    fake = FakeExecutor({"c7-br": {"CHECK": b""}})
    cfg = parse_config({"state_dir": str(tmp_path / "state")})
    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake))
    conflist = json.dumps({"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "c7-br"}]}).encode()
    other = {**RESULT, "ips": [{"address": "10.79.0.99/24"}]}
    plan.cni.cache.write(
        CacheEntry(POD, "eth0", "podnet", conflist, "/run/netns/c7", result=RESULT if on_disk else other)
    )
    entry = CacheEntry(POD, "eth0", "podnet", conflist, "/run/netns/c7", result=RESULT)
    assert asyncio.run(plan.check_entry(entry, "")) == ""
    (check,) = [c for c in fake.calls if c.command == "CHECK"]
    assert json.loads(check.stdin)["prevResult"]["ips"][0]["address"] == "10.79.0.2/24"
