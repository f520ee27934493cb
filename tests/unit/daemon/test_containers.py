"""ContainerNetworks (nri_cni/daemon/containers.py): the status file written before the answer,
rewritten after a repair, gone with the pod; refusals logged once per pod and counted; the NRI
CreateContainer answer built from it (nri_answer.container_response, plugin_service)."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from nri_cni.api import nri_pb2
from nri_cni.cni.cache import CacheEntry
from nri_cni.config import Config, ConfigSource
from nri_cni.daemon.adjust import NETWORK_STATUS_ANNOTATION, STATUS_FILE, STATUS_MOUNT
from nri_cni.daemon.containers import ContainerNetworks, PodEntries
from nri_cni.daemon.nri_answer import container_response
from nri_cni.daemon.podreport import PodsView, pods_report
from nri_cni.nri.handlers import handlers_of
from nri_cni.nri.plugin_service import PluginService
from nri_cni.pod.model import PodInfo
from nri_cni.pod.oprecord import OpRecord

POD = "a" * 64
OTHER = "b" * 64


def entry(pod: str, ifname: str, network: str, mac: str, metadata: dict | None = None) -> CacheEntry:
    iface: dict = {"name": ifname, "mac": mac, "sandbox": "/var/run/netns/x"}
    if metadata:
        iface["metadata"] = metadata
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
    def __init__(self, tmp_path) -> None:
        self.held: dict[str, list[CacheEntry]] = {}
        self.refusals: list[str] = []
        self.containers = ContainerNetworks(
            ConfigSource(Config(state_dir=str(tmp_path))),
            PodEntries(own=lambda pod: list(self.held.get(pod, [])), runtime=lambda pod: []),
            count_refusal=self.refusals.append,
        )

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
        w.containers.adjust(POD, "default/web")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'vf'" in lines[0] and "key-not-namespaced" in lines[0]
    assert w.refusals == ["key-not-namespaced", "key-not-namespaced"]
    assert first.annotations["nri-cni.io/eth0/a.io/ok"] == "1"  # the container is still adjusted


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
