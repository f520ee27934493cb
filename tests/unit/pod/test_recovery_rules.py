"""The recovery rules, without plugins or namespaces: which failed ADD counts as "nothing
created", how a DEL is cut around a doomed plugin, the intent record of a rollback that failed,
the failed plugin's position on its error and the timings its observer gets, each operation's
own plugin calls in its record, and when a netns counts as gone."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.config import parse_config
from nri_cni.errors import CniCode, CNIError, PluginExecError, PluginNotRun, PluginRef, PluginTimeout
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.model import AttachRequest, PodInfo, PrimaryNetwork
from nri_cni.pod.oprecord import OpRecord
from nri_cni.pod.rollback import nothing_created
from nri_cni.pod.upkeep import netns_gone
from nri_cni.service.modes import mode_for
from tests.support.delrecorder import CHAIN, del_recording_plan
from tests.support.pods import pod_plan, pod_service

POD = "0123456789abcdef" * 4


def _ref(plugin="ctl"):
    return PluginRef(network="podnet", plugin=plugin, command="ADD")


@pytest.mark.parametrize(
    "exc, doomed",
    [
        (CNIError(CniCode.INCOMPATIBLE_VERSION, "x", ref=_ref()), True),
        (CNIError(CniCode.UNSUPPORTED_FIELD, "x", ref=_ref()), True),
        (CNIError(CniCode.UNKNOWN_CONTAINER, "x", ref=_ref()), True),
        (CNIError(CniCode.INVALID_ENV, "x", ref=_ref()), True),
        (CNIError(CniCode.DECODING_FAILURE, "x", ref=_ref()), True),
        (CNIError(CniCode.INVALID_CONFIG, "x", ref=_ref()), True),
        (CNIError(CniCode.IO_FAILURE, "x", ref=_ref()), False),
        (CNIError(CniCode.INVALID_NETNS, "x", ref=_ref()), False),  # skel checks it after cmdAdd
        (CNIError(CniCode.TRY_AGAIN_LATER, "x", ref=_ref()), False),
        (CNIError(CniCode.INTERNAL, "x", ref=_ref()), False),
        (CNIError(120, "plugin-specific", ref=_ref()), False),
        # the runtime's own failure (a cache write): no plugin to blame
        (CNIError(CniCode.IO_FAILURE, "cannot write CNI cache file"), False),
        (CNIError(CniCode.INVALID_CONFIG, "no plugin named"), False),
        (PluginNotRun("failed to find plugin 'ctl' in path ['/x']", ref=_ref()), True),
        (PluginNotRun("cannot run plugin /x/ctl: Permission denied", ref=_ref()), True),
        # the kind decides, not the wording: a crash worded like a missing binary still ran
        (PluginExecError("failed to find plugin 'ctl' (it said so, then crashed)", ref=_ref()), False),
        # it ran: whatever it printed, it may have created things
        (
            PluginExecError(
                "plugin ctl failed (exit status 2) and its output is not a CNI error",
                ref=_ref(),
                code=CniCode.DECODING_FAILURE,
            ),
            False,
        ),
        (
            PluginExecError(
                "plugin ctl printed an unusable result: x", ref=_ref(), code=CniCode.DECODING_FAILURE
            ),
            False,
        ),
        (PluginTimeout("plugin ctl killed after 1s timeout", ref=_ref()), False),
    ],
)
def test_nothing_created(exc, doomed):
    assert nothing_created(exc) is doomed


def _entry():
    conf = parse_conflist(CHAIN)
    return CacheEntry(container_id=POD, ifname="eth0", network_name="podnet", config=conf.bytes)


def test_del_is_cut_around_the_doomed_plugin_and_its_failure_ignored(tmp_path):
    net = del_recording_plan(tmp_path, fail={"ctl"})
    asyncio.run(net.rollback.delete_entry(_entry(), doomed={2}))
    # portmap, then ctl alone (fails: ignored), then tuning and bridge: every DEL ran
    assert net.cni.calls == [["portmap"], ["ctl"], ["tuning", "bridge"]]


def test_without_a_doomed_record_the_del_stops_at_the_failure(tmp_path):
    net = del_recording_plan(tmp_path, fail={"ctl"})
    with pytest.raises(CNIError):
        asyncio.run(net.rollback.delete_entry(_entry()))
    assert net.cni.calls == [["portmap", "ctl", "tuning", "bridge"]]  # one chain; ctl failed it


def test_a_failure_of_a_plugin_that_is_not_doomed_still_counts(tmp_path):
    net = del_recording_plan(tmp_path, fail={"tuning"})
    with pytest.raises(CNIError) as err:
        asyncio.run(net.rollback.delete_entry(_entry(), doomed={2}))
    assert "tuning" in str(err.value)
    assert net.cni.calls == [["portmap"], ["ctl"], ["tuning", "bridge"]]


def test_failed_rollback_keeps_what_is_left_in_the_record_and_retries(tmp_path):
    net = del_recording_plan(tmp_path, fail={"ctl"})
    config = parse_conflist(CHAIN).bytes
    intent = Intent(POD, "", [IntendedNetwork("podnet", "eth0", config)])
    net.intents.write(intent)
    record = OpRecord("rollback", PodInfo(POD))
    errors = asyncio.run(net.rollback.undo(intent, record))
    assert len(errors) == 1 and "ctl DEL failed" in str(errors[0])
    kept = net.intents.load(POD)
    assert kept is not None and "ctl DEL failed" in kept.rollback_error
    assert [n.network for n in kept.networks] == ["podnet"]
    assert pod_service(net.cfg, net, mode=mode_for(net.cfg)).view.pending_rollbacks() == [POD]

    net.cni.fail = set()  # the plugin recovered: the next try (GC) finishes it
    report = asyncio.run(net.collect_garbage(set()))
    assert report["rolledBack"] == [POD] and report["errors"] == []
    assert net.cni.calls[-1] == ["GC", "podnet", 0]
    assert net.intents.load(POD) is None


def test_intent_record_round_trip_with_doomed_plugins(tmp_path):
    store = IntentStore(str(tmp_path))
    net = IntendedNetwork(
        "podnet", "eth0", b"{}", [("K8S_POD_NAME", "web")], {"mac": "x"}, doomed_plugins=["2:ctl"]
    )
    store.write(Intent(POD, "/run/netns/x", [net], rollback_error="boom"))
    [back] = store.load_all()
    assert back.networks[0].doomed_indexes() == {2}
    assert back.rollback_error == "boom" and back.netns == "/run/netns/x"
    assert store.pod_ids() == [POD]
    (tmp_path / "intents" / "garbage").write_text("{")
    assert [i.pod_id for i in store.load_all()] == [POD]
    assert store.pod_ids() == [POD]  # the unreadable one was removed


def test_the_failed_plugins_position_travels_on_its_error_and_timings_reach_the_observer(tmp_path):
    """No side table: the CNI runtime puts the failed plugin's position in its chain on the
    error (what the doomed-delete record needs), and tells the operation's record of each plugin
    call that succeeded (its timings in the log line)."""
    from nri_cni.cni.executor import FakeExecutor
    from nri_cni.cni.runtime import CNIRuntime, RuntimeConf
    from nri_cni.pod.model import PodInfo
    from nri_cni.pod.oprecord import OpRecord

    ok = b'{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}]}'
    failing = CNIError(CniCode.INVALID_CONFIG, "bad ctl config")
    fake = FakeExecutor(
        {"bridge": {"ADD": ok}, "tuning": {"ADD": ok}, "ctl": {"ADD": failing}, "portmap": {}}
    )
    cni = CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake)
    record = OpRecord("add", PodInfo(POD))
    rt = RuntimeConf(container_id=POD, netns="/run/netns/x", ifname="eth0")
    with pytest.raises(CNIError) as err:
        asyncio.run(cni.add(parse_conflist(CHAIN), rt, observe=record))
    assert err.value.plugin_index == 2 and err.value.ref.plugin == "ctl"
    assert [(p["plugin"], p["command"]) for p in record.plugins] == [("bridge", "ADD"), ("tuning", "ADD")]
    assert all(isinstance(p["ms"], float) for p in record.plugins)
    # a binary missing: no plugin started, no position (every place of that type is absent)
    missing = CNIRuntime(["/fake-bin"], str(tmp_path / "cache2"), executor=FakeExecutor({"bridge": ok}))
    with pytest.raises(CNIError) as err:
        asyncio.run(missing.add(parse_conflist(CHAIN), rt))
    assert err.value.plugin_index is None and err.value.ref.plugin == "tuning"


def test_netns_gone(tmp_path):
    present = tmp_path / "ns-present"
    present.write_text("")
    assert not netns_gone(str(present))
    assert netns_gone(str(tmp_path / "ns-removed"))
    # nothing can be said: no path, a relative one, or a directory this process cannot see
    assert not netns_gone("")
    assert not netns_gone("ns-relative")
    assert not netns_gone(str(tmp_path / "not-mounted-here" / "cni-1234"))
    assert os.path.isdir(tmp_path)


def test_each_operation_records_its_own_plugin_calls(tmp_path):
    """ADD, the shim's CHECK (CRI-O's after every ADD) and DEL: each record holds its own
    plugins' calls, handed to it by the CNI runtime (no side table that a later operation drains)."""
    from nri_cni.cni.executor import FakeExecutor
    from nri_cni.cni.runtime import CNIRuntime
    from nri_cni.pod.model import PodInfo

    ok = b'{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}]}'
    fake = FakeExecutor({t: {"ADD": ok} for t in ("bridge", "tuning", "ctl", "portmap")})
    cfg = parse_config(
        {
            "state_dir": str(tmp_path / "state"),
            "networks": [{"name": "podnet", "default": True, "conflist": CHAIN}],
        },
        str(tmp_path / "c.yaml"),
    )
    emitted: list = []

    class Sink:
        def observe_operation(self, record):
            emitted.append(record)

        def observe_gc(self, report):
            pass

    plan = pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=fake), sink=Sink())
    pod = PodInfo(POD, name="p", namespace="default", netns=str(tmp_path))
    asyncio.run(
        plan.attach(pod, plan.select(pod, PrimaryNetwork("", True), AttachRequest()), AttachRequest())
    )
    asyncio.run(plan.check(pod))
    asyncio.run(plan.detach(pod))
    add, check, delete = emitted
    assert (add.op, check.op, delete.op) == ("add", "check", "del")
    assert [p["command"] for p in delete.plugins] == ["DEL"] * 4  # the chain in reverse
    assert [p["command"] for p in add.plugins] == ["ADD"] * 4
    assert [(p["plugin"], p["command"]) for p in check.plugins] == [
        (t, "CHECK") for t in ("bridge", "tuning", "ctl", "portmap")
    ]


def test_a_del_given_a_netns_path_that_is_no_netns_runs_with_an_empty_cni_netns(tmp_path):
    """A path a runtime's unmount (or its kill before the mount) left as a plain file is not
    handed to the plugins (they fail on it: "unknown FS magic"): the DEL runs without a netns,
    as for a path that is gone; a live netns path is kept."""
    seen = []

    async def recording(entry, *, observe=None):
        seen.append(entry.netns)

    plan = del_recording_plan(tmp_path, fail=set())
    plan.cni.delete_cached = recording
    left_file = tmp_path / "cni-left-behind"
    left_file.write_text("")
    for netns in (str(left_file), str(tmp_path / "gone"), "/proc/self/ns/net"):
        asyncio.run(plan.rollback.delete_entry(_entry(), netns=netns))
    # from the cache entry when the caller has none
    asyncio.run(plan.rollback.delete_entry(dataclasses.replace(_entry(), netns=str(left_file))))
    assert seen == ["", "", "/proc/self/ns/net", ""]
