"""Upkeep's decisions (nri_cni/pod/upkeep.py): how many stale pods GC takes at once, when a pod's
netns counts as gone, which pods the reaper takes, which temp files the start-up sweep drops."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from nri_cni.cni.cache import CacheEntry
from nri_cni.cni.exec_errors import Ended
from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import Config
from nri_cni.pod.detach import Detacher
from nri_cni.pod.intents import IntendedNetwork, Intent, IntentStore
from nri_cni.pod.locks import PodLocks
from nri_cni.pod.model import K8S_POD_NAME, K8S_POD_NAMESPACE, PodInfo
from nri_cni.pod.oprecord import OperationLog, OpRecord
from nri_cni.pod.rollback import Rollback
from nri_cni.pod.upkeep import (
    Upkeep,
    all_netns_gone,
    by_pod,
    gc_parallel,
    netns_gone,
    pause_alive,
    pod_of,
    stat_runs,
)
from tests.support.aio import on_a_loop

POD, OTHER = "a" * 64, "b" * 64
CONFLIST = {"cniVersion": "1.1.0", "name": "net-a", "plugins": [{"type": "up-a"}]}


@pytest.mark.parametrize(
    "configured, cpus, expected",
    [
        (3, 8, 3),  # configured: the machine says nothing
        (0, 1, 4),  # at least 4
        (0, None, 4),  # CPUs unknown: as one
        (0, 2, 8),  # 4 per CPU
        (0, 3, 12),
        (0, 4, 16),
        (0, 5, 16),  # at most 16
    ],
)
def test_gc_parallel(monkeypatch, configured, cpus, expected):
    """Control case: (0, 4) against (0, 5): one CPU more stops adding slots at 16."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert gc_parallel(Config(gc_parallel=configured)) == expected


@pytest.mark.parametrize(
    "paths, expected",
    [
        ([], False),  # nothing recorded: nothing can be said
        ([""], False),
        (["gone-1"], True),
        (["gone-1", "gone-2"], True),
        (["gone-1", ""], True),  # an entry without a path says nothing
        (["gone-1", "present"], False),  # one path still there: the pod may live
        (["present"], False),
    ],
)
def test_all_netns_gone(tmp_path, paths, expected):
    """Control case: ["gone-1", "gone-2"] against ["gone-1", "present"]."""
    (tmp_path / "present").write_text("")
    entries = [
        CacheEntry(POD, f"eth{i}", "net-a", b"{}", netns=str(tmp_path / p) if p else "")
        for i, p in enumerate(paths)
    ]
    assert all_netns_gone(entries) is expected


def test_by_pod_and_pod_of():
    named = CacheEntry(
        POD, "eth0", "net-a", b"{}", cni_args=[(K8S_POD_NAMESPACE, "ns"), (K8S_POD_NAME, "web")]
    )
    second = CacheEntry(POD, "net1", "net-b", b"{}")
    unnamed = CacheEntry(OTHER, "eth0", "net-a", b"{}")
    assert by_pod([named, unnamed, second]) == {POD: [named, second], OTHER: [unnamed]}
    assert pod_of(named) == PodInfo(id=POD, name="web", namespace="ns")
    assert pod_of(unnamed) == PodInfo(id=OTHER, name="", namespace="")


class Node:
    """An Upkeep over a cache in tmp_path, its one plugin `up-a` answering every DEL with `delete`."""

    def __init__(self, tmp_path, delete: Ended | bytes = b"") -> None:
        self.fake = FakeExecutor({"up-a": {"DEL": delete}})
        self.cni = CNIRuntime([str(tmp_path / "bin")], str(tmp_path / "cache"), executor=self.fake)
        self.intents = IntentStore(str(tmp_path / "state"))
        rollback = Rollback(self.cni, self.intents)
        detacher = Detacher(self.cni, intents=self.intents, rollback=rollback)
        cfg = Config(state_dir=str(tmp_path / "state"))
        self.records: list[OpRecord] = []  # the op records the operations ended (the sink's view)
        self.upkeep = Upkeep(cfg, self.cni, rollback=rollback, detacher=detacher, oplog=OperationLog(self))

    def observe_operation(self, record: OpRecord) -> None:
        self.records.append(record)

    def observe_gc(self, report) -> None:
        return None

    def attach(self, pod_id: str, netns: str) -> None:
        self.cni.cache.write(CacheEntry(pod_id, "eth0", "net-a", json.dumps(CONFLIST).encode(), netns=netns))

    def cached(self) -> list[str]:
        return sorted(e.container_id for e in self.cni.cache.entries())


def test_reap_detaches_a_pod_whose_netns_is_gone(tmp_path):
    """Control case: the other pod, the same but for its netns path still there, is neither a
    candidate nor detached."""
    (tmp_path / "present").write_text("")
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / "gone"))
    node.attach(OTHER, str(tmp_path / "present"))
    assert asyncio.run(node.upkeep.reap_candidates()) == [POD]
    assert asyncio.run(node.upkeep.reap(OTHER)) is False
    assert node.fake.commands("up-a") == []
    assert asyncio.run(node.upkeep.reap(POD)) is True
    assert node.fake.commands("up-a") == ["DEL"]
    assert node.cached() == [OTHER]
    assert asyncio.run(node.upkeep.reap(POD)) is False  # detached already: nothing left


def test_reap_candidates_are_read_off_the_event_loop(tmp_path, monkeypatch):
    """The reaper runs every status interval: its reading of every cache entry (and a stat per
    pod) in a thread, as GC's, never holding the loop and the pod requests that come meanwhile.
    Control: the probe, called on the loop, tells the loop's thread."""
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / "gone"))
    threads: list[bool] = []  # per reading of the whole cache: was a loop running in its thread
    real = node.cni.cache.entries

    def entries(container_id=None, network=None):
        threads.append(on_a_loop())
        return real(container_id, network)

    monkeypatch.setattr(node.cni.cache, "entries", entries)

    async def scenario():
        assert on_a_loop()  # control
        return await node.upkeep.reap_candidates()

    assert asyncio.run(scenario()) == [POD]
    assert threads == [False]


def test_reap_whose_del_fails_is_not_done(tmp_path):
    """Control case: test_reap_detaches_a_pod_whose_netns_is_gone, the same pod whose DEL passes."""
    failing = Ended(stdout=b'{"cniVersion":"1.1.0","code":11,"msg":"busy"}', status=1)
    node = Node(tmp_path, delete=failing)
    node.attach(POD, str(tmp_path / "gone"))
    assert asyncio.run(node.upkeep.reap(POD)) is False
    assert node.fake.commands("up-a") == ["DEL"]
    assert node.cached() == [POD]  # GC retries


def test_recover_rolls_back_an_interrupted_add(tmp_path):
    node = Node(tmp_path)
    net = IntendedNetwork("net-a", "eth0", json.dumps(CONFLIST).encode())
    node.intents.write(Intent(POD, str(tmp_path / "gone"), [net]))
    asyncio.run(node.upkeep.recover(node.intents.load(POD)))
    assert node.fake.commands("up-a") == ["DEL"]
    assert node.intents.pod_ids() == []


@pytest.mark.parametrize("running, deleted", [(False, True), (True, False)])
def test_gc_keeps_a_valid_pod_whose_netns_path_is_gone_only_while_it_runs(tmp_path, running, deleted):
    """The pod is valid (the runtime lists it) and its netns path is gone; the two cases are
    each other's control: only whether its pause process runs differs (asked by the pod's id)."""
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / "gone"))
    report = asyncio.run(node.upkeep.collect_garbage({POD}, running=lambda pod_id: running and pod_id == POD))
    assert report["deleted"] == ([f"net-a/{POD}/eth0"] if deleted else [])
    assert node.cached() == ([] if deleted else [POD])


@pytest.mark.parametrize(
    "valid_again, netns, running, deleted",
    [
        (False, "present", False, True),  # still stale: DELed
        (True, "present", False, False),  # an ADD made it valid meanwhile: kept
        (True, "gone", True, False),  # valid, its path gone, but it runs: kept
        (True, "gone", False, True),  # valid but its netns gone and nothing runs: DELed
    ],
)
def test_gc_asks_again_under_the_pods_lock(tmp_path, valid_again, netns, running, deleted):
    """The pod is stale when GC lists the stale pods; under its lock GC asks the valid set again.
    Control cases: each row differs from the one above in one input, and the outcome flips.
    `running` is asked by the pod's id."""
    (tmp_path / "present").write_text("")
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / netns))
    asked: list[int] = []

    def valid() -> set[str]:
        asked.append(1)
        return {POD} if valid_again and len(asked) > 1 else set()

    report = asyncio.run(node.upkeep.collect_garbage(valid, running=lambda pod_id: running and pod_id == POD))
    assert report["deleted"] == ([f"net-a/{POD}/eth0"] if deleted else [])
    assert node.cached() == ([] if deleted else [POD])


def test_sweep_drops_the_temp_files_of_other_processes_only(tmp_path):
    """Control case: the same temp name with this process's pid is kept (a write of ours may be
    under way), as is a file that is no temp file."""
    node = Node(tmp_path)
    results = node.cni.cache.results_dir
    os.makedirs(results)
    names = {
        f".net-a-x-eth0.{os.getpid()}0.0.tmp": False,  # another process's (its pid begins as ours)
        f".net-a-x-eth0.{os.getpid()}.0.tmp": True,
        "net-a-x-eth0": True,
    }
    for name in names:
        with open(os.path.join(results, name), "w") as f:
            f.write("{}")
    deleted = node.cni.cache.deleted_dir  # entries deleted, not yet unlinked when a kill came
    os.makedirs(deleted)
    with open(os.path.join(deleted, "net-a-y-eth0.999.3"), "w") as f:
        f.write("{}")
    node.upkeep.sweep_cache_leftovers()
    assert sorted(os.listdir(results)) == sorted(n for n, kept in names.items() if kept)
    assert os.listdir(deleted) == []


def test_sweep_without_a_cache_dir_does_nothing(tmp_path):
    node = Node(tmp_path)
    node.upkeep.sweep_cache_leftovers()
    assert not os.path.exists(node.cni.cache.results_dir)


BUSY = Ended(stdout=b'{"cniVersion":"1.1.0","code":11,"msg":"busy"}', status=1)


def _told(record: OpRecord) -> tuple:
    """What an op record says: its op, each network's step, how many plugin calls it saw, the
    CNI code of its first failure."""
    steps = [(n["network"], n["ifname"], n["op"]) for n in record.networks]
    return record.op, steps, len(record.plugins), getattr(record.error, "code", None)


@pytest.mark.parametrize("delete", [b"", BUSY], ids=["del-passes", "del-fails"])
@pytest.mark.parametrize("operation", ["reap", "gc", "recover", "gc-rollback"])
def test_each_upkeep_operation_tells_its_op_record_what_it_did(tmp_path, operation, delete):
    """The log line and the metrics see the op by name, each network's DEL step, the plugin
    calls and the first failure's code. Control: each operation with its DEL passing (no code,
    one plugin call seen) beside the same with its DEL failing (code 11, the call not seen)."""
    node = Node(tmp_path, delete=delete)
    net = IntendedNetwork("net-a", "eth0", json.dumps(CONFLIST).encode())
    if operation == "reap":
        node.attach(POD, str(tmp_path / "gone"))
        asyncio.run(node.upkeep.reap(POD))
        expected_op, step = "reap", "del"
    elif operation == "gc":
        node.attach(POD, str(tmp_path / "gone"))
        asyncio.run(node.upkeep.collect_garbage(set(), running=lambda pod_id: False))
        expected_op, step = "gc-del", "del"
    elif operation == "recover":
        node.intents.write(Intent(POD, str(tmp_path / "gone"), [net]))
        asyncio.run(node.upkeep.recover(node.intents.load(POD)))
        expected_op, step = "recover", "recover"
    else:
        node.intents.write(Intent(POD, str(tmp_path / "gone"), [net]))
        report = asyncio.run(node.upkeep.collect_garbage(set(), running=lambda pod_id: False))
        expected_op, step = "gc-rollback", "rollback"
        failed = delete == BUSY
        assert report["rolledBack"] == ([] if failed else [POD])
        assert [e.split(":")[0] for e in report["errors"]] == ([f"rollback of pod {POD}"] if failed else [])
    (record,) = node.records
    passed = delete == b""
    assert _told(record) == (
        expected_op,
        [("net-a", "eth0", step)],
        1 if passed else 0,
        None if passed else 11,
    )


@pytest.mark.parametrize(
    "stat, runs",
    [
        (b"12 (pause) S 1 12", True),
        (b"12 (pause) Z 1 12", False),  # control: the same, a zombie
        (b"12 (pause) X 1 12", False),  # dead
        (b"12 (a) Z b) S 1 12", True),  # the state follows the command's last parenthesis
        (b"12 (pause)", False),  # no state: nothing said
        (b"", False),
        (b") S", False),  # no pid before the command: not a stat line
        (b"1) S", True),  # control: one byte before it
    ],
)
def test_stat_runs(stat, runs):
    assert stat_runs(stat) is runs


def test_pause_alive_reads_any_pid_but_the_unknown_0():
    """PID 1 runs in every PID namespace; 0 is NRI's "unknown"."""
    assert pause_alive(1) is True
    assert pause_alive(0) is False


def test_a_relative_netns_path_says_nothing_even_where_its_folder_exists(tmp_path, monkeypatch):
    """Control: the same path made absolute is gone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "netns").mkdir()
    assert netns_gone("netns/cni-1") is False
    assert netns_gone(str(tmp_path / "netns" / "cni-1")) is True


@pytest.mark.parametrize(
    "netns, running, asked",
    [
        ("present", False, 1),  # valid, its netns there: no candidate
        ("gone", True, 1),  # valid, its path gone, but its pause process runs: no candidate
        ("gone", False, 2),  # control: valid, its path gone, nothing runs: a candidate
    ],
)
def test_gc_takes_no_valid_pod_whose_netns_is_there_or_that_runs(tmp_path, netns, running, asked):
    """A candidate is asked about again under its lock: valid() is called once for the snapshot
    and once more per candidate. Each row differs from the control in one input."""
    (tmp_path / "present").write_text("")
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / netns))
    calls: list[int] = []

    def valid() -> set[str]:
        calls.append(1)
        return {POD}

    asyncio.run(node.upkeep.collect_garbage(valid, running=lambda pod_id: running and pod_id == POD))
    assert len(calls) == asked


def test_without_running_gc_takes_nothing_as_running(tmp_path):
    """A caller that knows no pause process (a tool): a valid pod whose netns is gone is DELed.
    Control: test_gc_keeps_a_valid_pod_whose_netns_path_is_gone_only_while_it_runs, where the
    caller says it runs, keeps it."""
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / "gone"))
    report = asyncio.run(node.upkeep.collect_garbage({POD}))
    assert report["deleted"] == [f"net-a/{POD}/eth0"]


class AskedLocks(PodLocks):
    """The service's locks, with an event: GC has asked whether a pod is busy."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    def busy(self, pod_id: str) -> bool:
        self.asked.set()
        return super().busy(pod_id)


@pytest.mark.parametrize("held", [True, False], ids=["lock-held", "control-lock-free"])
def test_gc_leaves_a_stale_pod_whose_lock_is_held_to_the_next_gc(tmp_path, held):
    """The pod is stale (the runtime does not list it). An operation holds its lock until GC
    has asked whether the pod is busy: GC leaves it (no DEL; the operation's own DEL or ADD
    decides), and the GC after it, the lock free, DELs it. Control: the same GC, nothing
    holding the lock -> the pod is DELed by the first GC."""
    node = Node(tmp_path)
    node.attach(POD, str(tmp_path / "netns"))

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        locks = AskedLocks()
        holding = asyncio.Event()

        async def operation() -> None:
            async with locks.pod(POD):
                holding.set()
                await locks.asked.wait()

        ops = []
        if held:
            ops.append(asyncio.create_task(operation()))
            await holding.wait()
        first = await node.upkeep.collect_garbage(set(), locks, running=lambda pod_id: False)
        await asyncio.gather(*ops)
        left = node.cached()
        second = await node.upkeep.collect_garbage(set(), locks, running=lambda pod_id: False)
        return first["deleted"], left, second["deleted"]

    deleted = [f"net-a/{POD}/eth0"]
    expected = ([], [POD], deleted) if held else (deleted, [], [])
    assert asyncio.run(scenario()) == expected
    assert node.cached() == []
