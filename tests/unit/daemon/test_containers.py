"""ContainerNetworks (nri_cni/daemon/containers.py): the status file written before the answer,
rewritten after a repair, gone with the pod; the pod's adjustment kept between its containers and
made again after what can change it (its operations, a reload, a socket directory's symlink);
refusals logged once per pod and counted; the NRI CreateContainer answer built from it
(nri_answer.container_response, plugin_service)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections import Counter

import pytest

from nri_cni.api import nri_pb2
from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config, ConfigSource, ContainerSettings
from nri_cni.daemon.adjust import NETWORK_STATUS_ANNOTATION, STATUS_FILE, STATUS_MOUNT
from nri_cni.daemon.containers import (
    KEEP,
    REMAKE,
    REMOVE,
    ContainerNetworks,
    PodEntries,
    after_operation,
)
from nri_cni.daemon.nri_answer import container_response
from nri_cni.daemon.podreport import PodsView, pods_report
from nri_cni.errors import NriCniError
from nri_cni.nri.handlers import handlers_of
from nri_cni.nri.plugin_service import PluginService
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord

POD = "a" * 64
OTHER = "b" * 64


def entry(
    pod: str, ifname: str, network: str, mac: str, metadata: dict | None = None, socket: str = ""
) -> CacheEntry:
    iface: dict = {"name": ifname, "mac": mac, "sandbox": "/var/run/netns/x"}
    if metadata:
        iface["metadata"] = metadata
    if socket:
        iface["socketPath"] = socket
    return CacheEntry(
        container_id=pod,
        ifname=ifname,
        network_name=network,
        config=b"{}",
        cni_args=[("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "web")],
        result={
            "cniVersion": "1.1.0",
            "interfaces": [iface],
            "ips": [{"address": "10.1.0.5/24", "interface": 0}],
        },
    )


class World:
    def __init__(self, tmp_path, cfg: Config | None = None) -> None:
        self.held: dict[str, list[CacheEntry]] = {}
        self.refusals: list[str] = []
        self.reads: Counter[str] = Counter()  # the PodEntries functions' calls, per pod
        self.links: dict[str, str] = {}  # what `resolve` says a path is (itself when not named)
        self.source = ConfigSource(cfg or Config(state_dir=str(tmp_path)))
        self.containers = ContainerNetworks(
            self.source,
            PodEntries(own=self.own, runtime=self.runtime),
            count_refusal=self.refusals.append,
            resolve=lambda path: self.links.get(path, path),
        )

    def own(self, pod: str) -> list[CacheEntry]:
        self.reads[pod] += 1
        return list(self.held.get(pod, []))

    def runtime(self, pod: str) -> list[CacheEntry]:
        self.reads[pod] += 1
        return []

    def file(self, pod: str = POD) -> list:
        with open(os.path.join(self.containers.pod_dir(pod), STATUS_FILE)) as f:
            return json.load(f)


def test_the_file_is_the_report_and_follows_a_repair(tmp_path):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01", {"example.com/vf": "3"})]
    adj = w.containers.adjust(POD, "default/web")
    report = pods_report(w.held[POD], PodsView(listed={}))[0]["network-status"]
    assert w.file() == report == json.loads(adj.annotations[NETWORK_STATUS_ANNOTATION])
    assert oct(os.stat(w.containers.pod_dir(POD)).st_mode & 0o777) == "0o755"

    # a repair changes the MAC: the file says so; an operation on a pod without a file makes none
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:02")]
    w.held[OTHER] = [entry(OTHER, "eth0", "podnet", "0a:00:00:00:00:03")]
    w.containers.observe_operation(OpRecord("repair", PodInfo(POD)))
    w.containers.observe_operation(OpRecord("add", PodInfo(OTHER)))
    assert w.file()[0]["mac"] == "0a:00:00:00:00:02"
    assert not os.path.exists(w.containers.pod_dir(OTHER))
    # control: a check is no reason to write
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:09")]
    w.containers.observe_operation(OpRecord("check", PodInfo(POD)))
    assert w.file()[0]["mac"] == "0a:00:00:00:00:02"


def test_the_directory_goes_with_the_pod(tmp_path):
    w = World(tmp_path)
    for pod in (POD, OTHER):
        w.held[pod] = [entry(pod, "eth0", "podnet", "0a:00:00:00:00:01")]
        w.containers.adjust(pod, "default/web")
    w.containers.observe_operation(OpRecord("gc-del", PodInfo(POD)))
    assert sorted(w.containers.pod_ids()) == [OTHER]
    w.containers.adjust(POD, "default/web")
    w.containers.retain({POD})  # a Synchronize that lists only POD
    assert sorted(w.containers.pod_ids()) == [POD]
    w.containers.forget(POD)  # RemovePodSandbox
    assert list(w.containers.pod_ids()) == []


# the pod's operation -> whether its directory is still there after it: the pod's DEL (stop),
# the GC's and the netns reaper's go; the control, the same pod after an add, a repair or a check,
# keeps it
OPERATIONS = [
    ("del", False),
    ("gc-del", False),
    ("reap", False),
    ("add", True),
    ("repair", True),
    ("check", True),
]


@pytest.mark.parametrize(("op", "kept"), OPERATIONS)
def test_which_operations_remove_the_pods_directory(tmp_path, op, kept):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    w.containers.adjust(POD, "default/web")
    w.containers.observe_operation(OpRecord(op, PodInfo(POD)))
    assert os.path.isdir(w.containers.pod_dir(POD)) is kept


def test_refusals_are_logged_once_per_pod_and_counted_each_time(tmp_path, caplog):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01", {"vf": "3", "a.io/ok": "1"})]
    with caplog.at_level(logging.WARNING, logger="nri_cni.containers"):
        first = w.containers.adjust(POD, "default/web")
        w.containers.adjust(POD, "default/web")  # the kept adjustment
        w.containers.observe_operation(OpRecord("repair", PodInfo(POD)))
        w.containers.adjust(POD, "default/web")  # made again: still the same pod
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'vf'" in lines[0] and "key-not-namespaced" in lines[0]
    assert w.refusals == ["key-not-namespaced"] * 3
    assert first.annotations["nri-cni.io/eth0/a.io/ok"] == "1"  # the container is still adjusted
    # control: a pod forgotten and seen again is logged again
    w.containers.forget(POD)
    with caplog.at_level(logging.WARNING, logger="nri_cni.containers"):
        w.containers.adjust(POD, "default/web")
    assert len(caplog.records) == 2


def test_create_container_answer_carries_annotations_and_mounts(tmp_path):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]

    class Plugin:
        async def create_container(self, pod, container):
            adj = w.containers.adjust(pod.id, f"{pod.namespace}/{pod.name}")
            return None if adj.empty else container_response(adj)

    assert nri_pb2.CREATE_CONTAINER in handlers_of(Plugin()).events()
    service = PluginService(Plugin(), on_configured=lambda req: None, on_synchronized=lambda: None)
    create = service.handlers()["CreateContainer"]

    def ask(pod_id: str) -> nri_pb2.CreateContainerResponse:
        req = nri_pb2.CreateContainerRequest(
            pod=nri_pb2.PodSandbox(id=pod_id, name="web", namespace="default"),
            container=nri_pb2.Container(id="c" * 64, pod_sandbox_id=pod_id, name="app"),
        )
        return nri_pb2.CreateContainerResponse.FromString(asyncio.run(create(req.SerializeToString())))

    resp = ask(POD)
    assert NETWORK_STATUS_ANNOTATION in resp.adjust.annotations
    (mount,) = resp.adjust.mounts
    assert (mount.destination, mount.type, mount.source) == (STATUS_MOUNT, "bind", w.containers.pod_dir(POD))
    assert "ro" in mount.options
    # control: a pod without attachments gets an empty answer
    assert not ask(OTHER).HasField("adjust")
    # a pod id that could name a path: no adjustment, and no error that would fail the container
    assert not ask("../" + POD).HasField("adjust")


# a pod's operation -> what it means for its containers' record and directory: its DELs remove,
# a check keeps (nothing changed); every other operation, the rollbacks and the native-mode
# release of a missed pod too, may have changed its attachments: the record is made again
AFTER = [
    ("del", REMOVE),
    ("gc-del", REMOVE),
    ("reap", REMOVE),
    ("check", KEEP),
    ("add", REMAKE),
    ("repair", REMAKE),
    ("rollback", REMAKE),
    ("gc-rollback", REMAKE),
    ("recover", REMAKE),
    ("missed", REMAKE),
]


@pytest.mark.parametrize(("op", "action"), AFTER)
def test_after_operation(op, action):
    assert after_operation(op) == action


SOCKET = "/run/vhost/p1/sock"


def _operation(op: str, *, failed: bool = False):
    def event(w: World) -> None:
        record = OpRecord(op, PodInfo(POD))
        if failed:
            record.fail(NriCniError("a plugin failed"))
        w.containers.observe_operation(record)

    return event


def _reload(w: World) -> None:
    w.source.replace(dataclasses.replace(w.source.current))  # the same values: a new config


def _relink(w: World) -> None:
    w.links["/run/vhost/p1"] = "/etc"  # the socket's directory became a symlink


def _forget(w: World) -> None:
    w.containers.forget(POD)


# what happens between a pod's two CreateContainers -> whether the second one's adjustment is
# made again (the cache read again: the new MAC shows). The control, the first case: nothing
# happens, the second container gets the kept adjustment without a read; a check and another
# pod's add change nothing either
BETWEEN = [
    ("nothing", lambda w: None, False),
    ("a check", _operation("check"), False),
    ("another pod's add", lambda w: w.containers.observe_operation(OpRecord("add", PodInfo(OTHER))), False),
    ("an add", _operation("add"), True),
    ("a repair", _operation("repair"), True),
    ("a failed repair", _operation("repair", failed=True), True),
    ("a rollback", _operation("gc-rollback"), True),
    ("a reload", _reload, True),
    ("a socket directory's symlink", _relink, True),
    ("the pod forgotten", _forget, True),
]


@pytest.mark.parametrize(("event", "remade"), [(e, r) for _, e, r in BETWEEN], ids=[c for c, _, _ in BETWEEN])
def test_the_pods_adjustment_is_kept_until_something_changes_it(tmp_path, event, remade):
    cfg = Config(state_dir=str(tmp_path), containers=ContainerSettings(socket_dirs=("/run/vhost",)))
    w = World(tmp_path, cfg)
    w.held[POD] = [
        entry(POD, "eth0", "podnet", "0a:00:00:00:00:01"),
        entry(POD, "net1", "fastnet", "0a:00:00:00:00:02", socket=SOCKET),
    ]
    first = w.containers.adjust(POD, "default/web")
    assert w.reads[POD] == 2  # own and runtime, once
    assert [m.source for m in first.mounts] == [w.containers.pod_dir(POD), "/run/vhost/p1"]
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:09"), w.held[POD][1]]
    event(w)
    second = w.containers.adjust(POD, "default/web")
    mac = json.loads(second.annotations[NETWORK_STATUS_ANNOTATION])[0]["mac"]
    assert (mac == "0a:00:00:00:00:09") is remade
    assert w.reads[POD] == (4 if remade else 2)
    assert w.file()[0]["mac"] == mac  # the file is what the container gets
    assert w.refusals == (["socket-symlink"] if event is _relink else [])


def test_the_file_is_written_when_its_content_changes(tmp_path):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    w.containers.adjust(POD, "default/web")
    path = os.path.join(w.containers.pod_dir(POD), STATUS_FILE)
    written = os.stat(path).st_ino  # a write is a rename: a new inode
    w.containers.observe_operation(OpRecord("repair", PodInfo(POD)))  # nothing changed
    w.containers.adjust(POD, "default/web")
    assert os.stat(path).st_ino == written
    # control: a repair that changed the MAC writes it
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:02")]
    w.containers.observe_operation(OpRecord("repair", PodInfo(POD)))
    assert os.stat(path).st_ino != written
    assert w.file()[0]["mac"] == "0a:00:00:00:00:02"


def test_after_a_restart_the_first_container_gets_the_same_and_the_file_is_written(tmp_path):
    before = World(tmp_path)
    before.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    adj = before.containers.adjust(POD, "default/web")
    os.unlink(os.path.join(before.containers.pod_dir(POD), STATUS_FILE))  # whatever became of it
    after = World(tmp_path)  # nri-cni restarted: nothing kept in memory
    after.held = before.held
    assert after.containers.adjust(POD, "default/web") == adj
    assert after.file() == before.containers._pods[POD].adjustment.status


def test_a_synchronize_forgets_the_kept_adjustment_of_a_pod_without_a_directory(tmp_path, caplog):
    w = World(tmp_path)
    assert w.containers.adjust(POD, "default/web").empty  # no attachments (yet): nothing to give
    with caplog.at_level(logging.INFO, logger="nri_cni.containers"):
        w.containers.retain({OTHER})
    assert caplog.records == []  # no directory was removed
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    assert not w.containers.adjust(POD, "default/web").empty
    assert w.reads[POD] == 4
    # control: listed, the empty adjustment is kept until an operation of the pod
    w.containers.forget(POD)
    w.held.pop(POD)
    w.containers.adjust(POD, "default/web")
    w.containers.retain({POD})
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    assert w.containers.adjust(POD, "default/web").empty
    w.containers.observe_operation(OpRecord("add", PodInfo(POD)))
    assert not w.containers.adjust(POD, "default/web").empty


def test_a_pod_id_that_could_name_a_path_gets_no_record(tmp_path):
    w = World(tmp_path)
    with pytest.raises(NriCniError, match="not a valid id"):
        w.containers.adjust("../" + POD, "default/web")  # even without attachments
    w.containers.retain(set())  # a Synchronize has nothing to trip on
    assert w.reads == Counter()


def test_a_failed_write_keeps_nothing(tmp_path, caplog):
    w = World(tmp_path)
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:01")]
    w.containers.adjust(POD, "default/web")
    directory = w.containers.pod_dir(POD)
    os.unlink(os.path.join(directory, STATUS_FILE))
    os.rmdir(directory)
    with open(directory, "w"):  # the directory cannot be made: the write fails
        pass
    w.held[POD] = [entry(POD, "eth0", "podnet", "0a:00:00:00:00:02")]
    with caplog.at_level(logging.ERROR, logger="nri_cni.containers"):
        w.containers.observe_operation(OpRecord("repair", PodInfo(POD)))
    assert "its containers' status file" in caplog.text
    os.unlink(directory)
    # the next container makes it again: the new MAC, its file written
    adj = w.containers.adjust(POD, "default/web")
    assert json.loads(adj.annotations[NETWORK_STATUS_ANNOTATION])[0]["mac"] == "0a:00:00:00:00:02"
    assert w.file()[0]["mac"] == "0a:00:00:00:00:02"
