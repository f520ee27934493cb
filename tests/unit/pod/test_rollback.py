"""Rollback (nri_cni/pod/rollback.py) against a recording CNI runtime: what undo() DELs, with
which entry and netns, what it keeps in the intent record when a DEL fails; how a DEL is cut
around doomed plugins; which plugin positions record_doomed() writes down."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.cni.executor import FAKE_BIN, FakeExecutor
from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
from nri_cni.errors import CniCode, CNIError, ConfigError, Kind, NriCniError, PluginNotRun, PluginRef
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord
from nri_cni.pod.rollback import Rollback, nothing_created

POD = "0123456789abcdef" * 4
NETNS = "/proc/self/ns/net"  # a live netns path: delete_entry keeps it
CHAIN = {
    "cniVersion": "1.1.0",
    "name": "podnet",
    "plugins": [{"type": "bridge"}, {"type": "tuning"}, {"type": "ctl"}, {"type": "portmap"}],
}
CONFIG = parse_conflist(CHAIN).bytes


class RecordingCNI:
    """DELs recorded; a network (or plugin type) in `fail` fails its DEL."""

    def __init__(self, fail=(), cached=()) -> None:
        self.fail = set(fail)
        self.deleted: list[CacheEntry] = []
        self.parts: list[tuple[list[str], RuntimeConf]] = []
        self.prevs: list[object] = []  # the prevResult each part was given
        self.removed: list[tuple[str, str, str]] = []  # cache entries removed
        self.observers: list[object] = []
        by_key = {(e.network_name, e.container_id, e.ifname): e for e in cached}
        self.cache = SimpleNamespace(
            read=lambda *key: by_key.get(key), delete=lambda *key: self.removed.append(key)
        )

    def del_prev(self, net, rt, entry=None):
        return entry.result if entry is not None else None

    async def delete_cached(self, entry, *, observe=None):
        self.deleted.append(entry)
        self.observers.append(observe)
        if entry.network_name in self.fail:
            raise CNIError(111, f"{entry.network_name} DEL failed")

    async def delete_part(self, net, rt, prev, *, observe=None):
        types = [p.type for p in reversed(net.plugins)]
        self.parts.append((types, rt))
        self.prevs.append(prev)
        self.observers.append(observe)
        for t in types:
            if t in self.fail:
                raise CNIError(111, f"{t} DEL failed", ref=PluginRef(plugin=t, command="DEL"))


class FailingStore(IntentStore):
    def write(self, intent, *, durable=True):
        raise NriCniError("disk full", kind=Kind.IO)


def _net(name, ifname="eth0", **kw):
    return IntendedNetwork(name, ifname, CONFIG, [("K8S_POD_NAME", "web")], {"mac": "m"}, **kw)


def _undo(tmp_path, cni, intent, store=None, **kw):
    store = store or IntentStore(str(tmp_path))
    store.write(intent)
    record = OpRecord("rollback", PodInfo(POD))
    errors = asyncio.run(Rollback(cni, store).undo(intent, record, **kw))
    return errors, store, record


def test_nothing_created_is_false_for_an_error_that_is_not_nri_cnis():
    control = CNIError(CniCode.INVALID_CONFIG, "x", ref=PluginRef(plugin="ctl"))
    assert nothing_created(control) is True
    assert nothing_created(ValueError("invalid config")) is False


def test_undo_dels_last_first_from_the_record_and_clears_it(tmp_path):
    cni = RecordingCNI()
    intent = Intent(POD, NETNS, [_net("a"), _net("b", "net1")])
    errors, store, record = _undo(tmp_path, cni, intent)
    assert errors == [] and store.load(POD) is None
    assert [(e.network_name, e.ifname) for e in cni.deleted] == [("b", "net1"), ("a", "eth0")]
    want = CacheEntry(POD, "net1", "b", CONFIG, NETNS, [("K8S_POD_NAME", "web")], {"mac": "m"})
    assert cni.deleted[0] == want  # the record's config, args and the intent's netns
    assert [(s["network"], s["ifname"], s["op"]) for s in record.networks] == [
        ("b", "net1", "rollback"),
        ("a", "eth0", "rollback"),
    ]
    assert all(isinstance(s["ms"], float) for s in record.networks)  # each step timed
    assert cni.observers == [record, record]  # the plugins' calls go to the operation's record


def test_undo_prefers_the_cache_entry_and_the_callers_netns(tmp_path):
    cached = CacheEntry(POD, "eth0", "a", b'{"cached":1}', "/gone", [("K", "V")])
    # entries of another pod or interface are not this attachment's
    elsewhere = [
        dataclasses.replace(cached, container_id="f" * 64),
        dataclasses.replace(cached, ifname="net1"),
    ]
    cni = RecordingCNI(cached=[cached, *elsewhere])
    intent = Intent(POD, "/run/netns/not-there", [_net("a"), _net("b")])
    _undo(tmp_path, cni, intent, netns=NETNS, op="recover")
    # the control case is "b": nothing cached, so from the record
    assert cni.deleted == [
        CacheEntry(POD, "eth0", "b", CONFIG, NETNS, [("K8S_POD_NAME", "web")], {"mac": "m"}),
        dataclasses.replace(cached, netns=NETNS),
    ]


@pytest.mark.parametrize("op", ["rollback", "recover"])
def test_a_failed_undo_keeps_what_is_left_in_order_with_every_reason(tmp_path, caplog, op):
    cni = RecordingCNI(fail={"a", "c"})
    intent = Intent(POD, "/run/netns/x", [_net("a"), _net("b"), _net("c")])
    with caplog.at_level(logging.ERROR):
        errors, store, record = _undo(tmp_path, cni, intent, op=op)
    assert [str(e) for e in errors] == [
        "network 'c': c DEL failed (CNI code 111)",
        "network 'a': a DEL failed (CNI code 111)",
    ]
    kept = store.load(POD)
    assert [n.network for n in kept.networks] == ["a", "c"]  # "b" succeeded (the control)
    assert kept.netns == "/run/netns/x"
    assert (
        kept.rollback_error
        == "network 'c': c DEL failed (CNI code 111); network 'a': a DEL failed (CNI code 111)"
    )
    assert [s["op"] for s in record.networks] == [op] * 3
    # start-up recovery logs the pod's id (no name known yet); a rollback the pod's label
    said = {
        "recover": f"recovery: DEL of c for pod {POD} failed",
        "rollback": "rollback DEL of network 'c' failed",
    }
    assert (
        said[op] in caplog.text
        and said[{"recover": "rollback", "rollback": "recover"}[op]] not in caplog.text
    )


def test_undo_ignores_the_del_failure_of_a_doomed_plugin(tmp_path):
    cni = RecordingCNI(fail={"ctl"})
    intent = Intent(POD, "", [_net("podnet", doomed_plugins=["2:ctl"])])
    errors, store, record = _undo(tmp_path, cni, intent)
    assert errors == [] and store.load(POD) is None
    assert [types for types, _ in cni.parts] == [["portmap"], ["ctl"], ["tuning", "bridge"]]
    assert cni.observers == [record] * 3
    # the control case: the same record without the doomed plugin fails on ctl
    errors, store, _ = _undo(tmp_path, RecordingCNI(fail={"podnet"}), Intent(POD, "", [_net("podnet")]))
    assert len(errors) == 1 and store.load(POD) is not None


def test_a_failed_undo_whose_record_cannot_be_updated_still_reports(tmp_path, caplog):
    cni = RecordingCNI(fail={"a"})
    intent = Intent(POD, "", [_net("a")])
    store = FailingStore(str(tmp_path))
    IntentStore(str(tmp_path)).write(intent)
    with caplog.at_level(logging.ERROR):
        errors = asyncio.run(Rollback(cni, store).undo(intent, OpRecord("rollback", PodInfo(POD))))
    assert [str(e) for e in errors] == ["network 'a': a DEL failed (CNI code 111)"]
    assert "cannot update the intent record" in caplog.text
    assert store.load(POD) == intent  # the older record is still on disk


@pytest.mark.parametrize(
    "doomed, parts",
    [
        (set(), [["portmap", "ctl", "tuning", "bridge"]]),  # the control case: one DEL
        ({3}, [["portmap"], ["ctl", "tuning", "bridge"]]),
        ({2}, [["portmap"], ["ctl"], ["tuning", "bridge"]]),
        ({1, 2}, [["portmap"], ["ctl"], ["tuning"], ["bridge"]]),
        ({0}, [["portmap", "ctl", "tuning"], ["bridge"]]),
    ],
)
def test_the_del_is_cut_around_each_doomed_plugin(doomed, parts):
    cni = RecordingCNI()
    entry = CacheEntry(POD, "eth0", "podnet", CONFIG, "", [("K", "V")], {"mac": "m"})
    asyncio.run(Rollback(cni, IntentStore("/nonexistent")).delete_entry(entry, netns=NETNS, doomed=doomed))
    if doomed:
        assert [types for types, _ in cni.parts] == parts
        assert cni.removed == [("podnet", POD, "eth0")]  # once, after every part
        assert {(rt.container_id, rt.netns, rt.ifname) for _, rt in cni.parts} == {(POD, NETNS, "eth0")}
        assert all((rt.args, rt.capability_args) == ([("K", "V")], {"mac": "m"}) for _, rt in cni.parts)
    else:
        assert cni.parts == [] and cni.deleted == [dataclasses.replace(entry, netns=NETNS)]


@pytest.mark.parametrize("path, source", [("", "intent"), ("/c/podnet-x-eth0", "cache:/c/podnet-x-eth0")])
def test_a_doomed_del_of_an_unreadable_config_names_where_it_came_from(path, source):
    entry = CacheEntry(POD, "eth0", "podnet", b"{", path=path)
    with pytest.raises(ConfigError) as err:
        asyncio.run(Rollback(RecordingCNI(), IntentStore("/nonexistent")).delete_entry(entry, doomed={0}))
    assert err.value.location == source


def test_the_entrys_own_netns_is_used_when_the_caller_has_none():
    cni = RecordingCNI()
    rb = Rollback(cni, IntentStore("/nonexistent"))
    entry = CacheEntry(POD, "eth0", "podnet", CONFIG, NETNS)
    asyncio.run(rb.delete_entry(entry))
    asyncio.run(rb.delete_entry(dataclasses.replace(entry, netns="/run/netns/gone")))  # the control
    assert [e.netns for e in cni.deleted] == [NETNS, ""]


@pytest.mark.parametrize("bridge_fails", [False, True])
def test_a_del_cut_around_a_doomed_plugin_gives_every_part_the_prevresult_and_keeps_the_entry_until_all_ran(
    tmp_path, bridge_fails
):
    """The real CNI runtime over in-process plugins, an attachment cached with its result: each
    part of the cut DEL (portmap, then ctl alone, then tuning and bridge) gets that result as
    prevResult, and the entry goes only once the last part succeeded; bridge's DEL failing
    keeps it for GC (before, the first part's DEL removed it, and the later parts ran without
    a prevResult). The control: bridge succeeds, the entry goes."""
    fail = {"DEL": CNIError(11, "try later")}
    plugins = {"bridge": fail if bridge_fails else {}, "tuning": {}, "ctl": fail, "portmap": {}}
    cni = CNIRuntime([FAKE_BIN], str(tmp_path / "cache"), executor=FakeExecutor(plugins))
    result = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": NETNS}]}
    cni.cache.write(CacheEntry(POD, "eth0", "podnet", CONFIG, NETNS, result=result))
    (entry,) = cni.cache.entries()
    rb = Rollback(cni, IntentStore(str(tmp_path / "state")))
    if bridge_fails:
        with pytest.raises(CNIError, match="try later"):
            asyncio.run(rb.delete_entry(entry, netns=NETNS, doomed={2}))
    else:
        asyncio.run(rb.delete_entry(entry, netns=NETNS, doomed={2}))
    calls = cni.executor.calls
    assert [(c.plugin, c.command) for c in calls] == [
        (t, "DEL") for t in ("portmap", "ctl", "tuning", "bridge")
    ]
    assert [json.loads(c.stdin).get("prevResult") for c in calls] == [result] * 4
    assert [e.key for e in cni.cache.entries()] == ([("podnet", "eth0")] if bridge_fails else [])


def _doomed_chain(*types):
    return parse_conflist({"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": t} for t in types]})


def _failed(plugin, index=None, code=CniCode.INVALID_CONFIG):
    exc = CNIError(code, "x", ref=PluginRef(network="podnet", plugin=plugin, command="ADD"))
    exc.plugin_index = index
    return exc


@pytest.mark.parametrize(
    "exc, recorded",
    [
        (_failed("ctl", 1), ["1:ctl"]),  # the control case: the runtime names the failed position
        (_failed("ctl", 0), ["1:ctl", "3:ctl"]),  # that position holds another type
        (_failed("ctl", None), ["1:ctl", "3:ctl"]),  # never started: every position of its type
        (_failed("ctl", 4), ["1:ctl", "3:ctl"]),  # past the chain's end
        (_failed("ctl", 3), ["3:ctl"]),
        (_failed("ctl", 1, code=CniCode.IO_FAILURE), []),  # it may have created something
        (NriCniError("not run", kind=Kind.PLUGIN_NOT_RUN), []),  # no plugin named: nothing to record
        (
            PluginNotRun("failed to find plugin", ref=PluginRef(network="podnet", plugin="ctl")),
            ["1:ctl", "3:ctl"],
        ),
    ],
)
def test_record_doomed_writes_down_the_failed_plugins_positions(tmp_path, exc, recorded):
    store = IntentStore(str(tmp_path))
    planned = _net("podnet")
    intent = Intent(POD, "", [planned])
    rt = RuntimeConf(POD, "", "eth0")
    Rollback(RecordingCNI(), store).record_doomed(
        intent, planned, _doomed_chain("bridge", "ctl", "tuning", "ctl"), rt, exc
    )
    assert planned.doomed_plugins == recorded
    on_disk = store.load(POD)
    assert (on_disk.networks[0].doomed_plugins if on_disk else None) == (recorded or None)


def test_record_doomed_that_cannot_write_is_logged(tmp_path, caplog):
    planned = _net("podnet")
    rt = RuntimeConf(POD, "", "eth0")
    with caplog.at_level(logging.ERROR):
        Rollback(RecordingCNI(), FailingStore(str(tmp_path))).record_doomed(
            Intent(POD, "", [planned]), planned, _doomed_chain("ctl"), rt, _failed("ctl", 0)
        )
    assert planned.doomed_plugins == ["0:ctl"]
    assert "cannot record the doomed plugin ctl" in caplog.text


@pytest.mark.parametrize("on_disk", [True, False], ids=["control-same-on-disk", "file-changed-since"])
def test_a_doomed_del_runs_with_the_result_of_the_entry_it_was_given(tmp_path, on_disk):
    """The DEL cut around a doomed plugin takes its prevResult from the entry the caller read
    (GC and a pod's DEL list the pod's entries first): the file is not read again, so a file
    changed since (here: another result) does not decide it. Control: the same file."""
    cni = CNIRuntime(
        [FAKE_BIN],
        str(tmp_path / "cache"),
        executor=FakeExecutor({p: {} for p in ("bridge", "tuning", "ctl", "portmap")}),
    )
    given = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "sandbox": NETNS}],
        "ips": [{"address": "10.81.0.2/24"}],
    }
    other = {**given, "ips": [{"address": "10.81.0.99/24"}]}
    cni.cache.write(CacheEntry(POD, "eth0", "podnet", CONFIG, NETNS, result=given if on_disk else other))
    entry = CacheEntry(POD, "eth0", "podnet", CONFIG, NETNS, result=given)
    asyncio.run(
        Rollback(cni, IntentStore(str(tmp_path / "state"))).delete_entry(entry, netns=NETNS, doomed={2})
    )
    prevs = {json.loads(c.stdin)["prevResult"]["ips"][0]["address"] for c in cni.executor.calls}
    assert prevs == {"10.81.0.2/24"}
