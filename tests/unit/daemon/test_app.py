"""The daemon as build_daemon composes it: the NRI events it subscribes to, in every mode.

In shim mode the RunPodSandbox attaches nothing (the shim's CNI ADD did) and answers nothing,
yet the subscription stays: the event is nri-cni's only word that the runtime has a pod made
after its last pod list (Synchronize comes only at a (re)connection), with the pod's pause pid,
IPs and annotations. Without it such a pod is missing from verify rounds, `nri-cni verify` and
`nri-cni pods`, its netns-path check loses the running pause, and GC deletes its networks once
`gc.unlisted_grace` has passed (measured: docs/performance.md, "One pod's timeline").
"""

from __future__ import annotations

import asyncio

import pytest

from nri_cni.api import nri_pb2
from nri_cni.daemon.app import build_daemon
from nri_cni.pod.model import PodInfo
from tests.support.configdocs import mode_config

EVERY_POD_EVENT = [
    nri_pb2.RUN_POD_SANDBOX,
    nri_pb2.STOP_POD_SANDBOX,
    nri_pb2.REMOVE_POD_SANDBOX,
    nri_pb2.CREATE_CONTAINER,
]


@pytest.mark.parametrize(
    ("mode", "extra"),
    [("shim", {}), ("secondary", {"primary_network": "cbr0"}), ("native", {})],
    ids=["shim", "secondary", "native"],
)
def test_every_mode_subscribes_to_every_pod_event_and_container_creation(tmp_path, mode, extra):
    daemon = build_daemon(mode_config(tmp_path, mode, **extra))
    assert daemon.pods.mode.name == mode
    assert daemon.stub.plugin.events() == EVERY_POD_EVENT


def _sandbox(pod_id: str, netns: str) -> nri_pb2.PodSandbox:
    sandbox = nri_pb2.PodSandbox(id=pod_id, name="ncver-shim", namespace="ncver", pid=4321, ips=["10.9.0.2"])
    sandbox.linux.namespaces.add(type="network", path=netns)
    return sandbox


@pytest.mark.parametrize("announced", [True, False])
def test_shim_mode_a_pod_made_after_the_runtime_s_list_is_kept_by_its_run_pod_sandbox(tmp_path, announced):
    """The shim's ADD of a pod the last Synchronize could not list, then the runtime's
    RunPodSandbox (`announced`); the control: no RunPodSandbox. Past gc.unlisted_grace, only
    the announced pod is still the runtime's for GC, verify and the reports."""
    daemon = build_daemon(mode_config(tmp_path, "shim"))
    roster = daemon.pods.roster
    now = [100.0]
    roster.clock = lambda: now[0]
    netns = tmp_path / "netns"
    netns.write_text("")  # the netns path is there: only the grace ends the doubt
    pod_id = "b" * 64
    roster.listed([])  # the runtime's list at the connection, before the pod
    roster.attached(PodInfo(pod_id, name="ncver-shim", namespace="ncver", netns=str(netns)))  # the shim's ADD
    if announced:
        answer = asyncio.run(daemon.handlers.run_pod_sandbox(_sandbox(pod_id, str(netns))))
        assert answer is None  # shim mode answers nothing
    now[0] += daemon.pods.cfg.gc_unlisted_grace + 1
    assert (pod_id in roster.valid_pod_ids(())) is announced
    assert (pod_id in roster.pods()) is announced
    if announced:
        assert roster.pods()[pod_id].pid == 4321
        assert roster.pods()[pod_id].ips == ("10.9.0.2",)
