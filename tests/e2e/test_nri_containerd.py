"""nri_cni's NRI transport (Stub, mux, ttrpc) against real containerd 2.1.

containerd runs its own CNI (the bridge network from conftest); the stub only records what
containerd sends: the handshake, Synchronize with the pods that exist, the pod events
(containerd 2.1 sends them as StateChange) and CreateContainer.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from nri_cni.api import nri_pb2
from tests.support.busybox import BUSYBOX, build_busybox_image
from tests.support.harness import pod_message
from tests.support.jsonlines import read_json_lines
from tests.support.nri_runtime import CONTAINERD, NriRuntime, container_at_create, stop_steps
from tests.support.stubthread import Recorder, StubThread, double_netns, observed_stop_steps

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stubs():
    """Start StubThreads through this; each is stopped after the test."""
    started: list[StubThread] = []

    def start(plugin, **kwargs) -> StubThread:
        st = StubThread(plugin, **kwargs).start()
        started.append(st)
        return st

    yield start
    errors = []
    for st in reversed(started):
        try:
            st.stop()
        except Exception as exc:  # report, but stop the others first
            errors.append(exc)
    if errors:
        raise errors[0]


def test_pod_events_reach_the_stub(bridge_network, make_containerd, stubs):
    ctd = make_containerd(cni_conf_dir=bridge_network.conf_dir, nri_request_timeout="7s")
    # a pod that exists before the plugin connects arrives in Synchronize
    early = ctd.cri.run_pod("early-0", "nct-nri", "uid-early")
    early_st = ctd.cri.pod_status(early)

    rec = Recorder()
    t0 = time.monotonic()
    st = stubs(rec, name="nctrec", idx="50", socket_path=ctd.nri_socket)
    st.wait_synchronized()
    handshake = time.monotonic() - t0
    assert rec.configures == [
        {
            "runtime_name": "containerd",
            "runtime_version": rec.configures[0]["runtime_version"],
            "registration_timeout": 5000,
            "request_timeout": 7000,
        }
    ]
    assert rec.configures[0]["runtime_version"].startswith("2.")
    # the NRI double (tests/support/nri_runtime.py), the only runtime native mode is tested
    # against, configures a plugin as this containerd does (the request timeout is set above)
    double = NriRuntime(None)
    assert {
        "runtime_name": double.runtime_name,
        "runtime_version": double.runtime_version,
        "registration_timeout": double.registration_timeout_ms,
        "request_timeout": 7000,
    } == rec.configures[0]
    assert len(rec.syncs) == 1
    [synced] = rec.syncs[0]
    assert (synced.id, synced.name, synced.namespace, synced.uid) == (
        early,
        "early-0",
        "nct-nri",
        "uid-early",
    )
    assert synced.netns == early_st.netns_path and os.path.exists(synced.netns)
    assert early_st.ip in synced.ips

    uid = str(uuid.uuid4())
    pod = ctd.cri.run_pod("web-0", "nct-nri", uid)
    status = ctd.cri.pod_status(pod)
    assert status.ready
    # containerd waits for the plugin, so the event is in before RunPodSandbox returns
    [(kind, run)] = rec.events_for(pod)
    assert kind == "run"
    assert (run.id, run.name, run.namespace, run.uid) == (pod, "web-0", "nct-nri", uid)
    assert run.netns == status.netns_path and run.netns.startswith("/var/run/netns/cni-")
    assert status.ip in run.ips and run.pid > 0

    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)
    kinds = [k for k, _ in rec.events_for(pod)]
    assert kinds == ["run", "stop", "remove"]
    stop, remove = rec.events_for(pod)[1][1], rec.events_for(pod)[2][1]
    assert (stop.id, stop.name, stop.namespace, stop.uid) == (pod, "web-0", "nct-nri", uid)
    assert stop.netns == status.netns_path  # still there at STOP (CNI DEL comes after)
    assert stop.netns_exists and observed_stop_steps(stop) == stop_steps(CONTAINERD)  # as the double
    assert (remove.id, remove.name, remove.namespace, remove.uid) == (pod, "web-0", "nct-nri", uid)
    assert remove.netns == ""  # containerd sends no netns path at REMOVE
    # nor does the NRI double as containerd
    assert double_netns(CONTAINERD, nri_pb2.REMOVE_POD_SANDBOX, status.netns_path) == ""
    assert rec.events_for(early) == []
    assert rec.disconnects == 0
    print(f"stub handshake {handshake:.3f}s")


class ContainerRecorder(Recorder):
    """The Recorder, also subscribed to CreateContainer: keeps each request, answers nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[nri_pb2.PodSandbox, nri_pb2.Container]] = []

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse | None:
        self._add(lambda: self.created.append((pod, container)))
        return None


def test_create_container_reaches_the_stub_as_the_double_sends_it(bridge_network, make_containerd, stubs):
    """containerd's CreateContainer request carries what the NRI double's (container_at_create)
    does: the container's id, its pod's id, its name, its args, state UNKNOWN; and the pod."""
    image = build_busybox_image()
    ctd = make_containerd(cni_conf_dir=bridge_network.conf_dir)
    ctd.import_image(image.archive)
    ctd._wait_image(image.ref)
    rec = ContainerRecorder()
    st = stubs(rec, name="nctrec", idx="50", socket_path=ctd.nri_socket)
    st.wait_synchronized()
    uid = str(uuid.uuid4())
    pod = ctd.cri.run_pod("app-0", "nct-nri", uid)
    args = [BUSYBOX, "sleep", "1000"]
    cid = ctd.cri.create_container(pod, ctd.cri.pod_config("app-0", "nct-nri", uid), "app", image.ref, args)
    # containerd waits for the plugin's answer, so the request is in before CreateContainer returns
    [(sent_pod, sent)] = rec.created
    assert (sent_pod.id, sent_pod.name, sent_pod.namespace, sent_pod.uid) == (pod, "app-0", "nct-nri", uid)
    double = container_at_create(pod_message(pod, ""), "app", args)
    fields = ("pod_sandbox_id", "name", "state", "args")
    assert [getattr(sent, f) for f in fields] == [getattr(double, f) for f in fields]
    assert sent.id == cid and len(double.id) == len(cid)
    ctd.cri.remove_container(cid)
    ctd.cri.stop_pod(pod)
    ctd.cri.remove_pod(pod)


def test_stub_reconnects_after_containerd_restart(bridge_network, make_containerd, stubs):
    ctd = make_containerd(cni_conf_dir=bridge_network.conf_dir)
    rec = Recorder()
    st = stubs(rec, name="nctrec", idx="50", socket_path=ctd.nri_socket)
    st.wait_synchronized()
    pod = ctd.cri.run_pod("db-0", "nct-nri", "uid-db")
    assert [k for k, _ in rec.events_for(pod)] == ["run"]

    ctd.stop()
    # (the stub may count more than one: a connect racing the shutdown is reset too)
    rec.wait_for(lambda: rec.disconnects >= 1)
    t0 = time.monotonic()
    ctd.start()
    # the same stub (never restarted) registers again and gets the running pod in Synchronize
    rec.wait_for(lambda: len(rec.syncs) == 2, timeout=60)
    reconnect = time.monotonic() - t0
    assert st.alive
    assert len(rec.configures) == 2
    assert [p.id for p in rec.syncs[1]] == [pod]
    assert rec.syncs[1][0].netns and os.path.exists(rec.syncs[1][0].netns)
    st.wait_synchronized()

    # and receives events again
    pod2 = ctd.cri.run_pod("db-1", "nct-nri", "uid-db1")
    assert [k for k, _ in rec.events_for(pod2)] == ["run"]
    for p in (pod, pod2):
        ctd.cri.stop_pod(p)
        ctd.cri.remove_pod(p)
    assert [k for k, _ in rec.events_for(pod2)] == ["run", "stop", "remove"]
    # containerd 2.1 keeps the NRI state of pods in memory only and does not rebuild it for
    # pods at Synchronize (containerd#8426, still so at 2.1.9): a pod that lived through the
    # restart gets NO stop or remove event. A plugin must find such pods gone by itself.
    assert [k for k, _ in rec.events_for(pod)] == ["run"]
    print(f"containerd restart to resynchronized stub {reconnect:.3f}s")


LAUNCHER = """\
#!{python}
# Written by tests/e2e/test_nri_containerd.py: a pre-registered NRI plugin that records what
# containerd sends into {out}.
import asyncio, json, os, sys
sys.path.insert(0, {repo!r})
from nri_cni.nri.stub import Stub

OUT = {out!r}

def emit(kind, **fields):
    with open(OUT, "a") as f:
        f.write(json.dumps(dict(kind=kind, **fields)) + "\\n")

def pod_fields(pod):
    netns = [ns.path for ns in pod.linux.namespaces if ns.type == "network"]
    return dict(id=pod.id, name=pod.name, namespace=pod.namespace, uid=pod.uid,
                netns=netns[0] if netns else "", ips=list(pod.ips))

class Plugin:
    async def configure(self, req):
        emit("configure", runtime=req.runtime_name, request_timeout=req.request_timeout)
    async def synchronize(self, pods, containers):
        emit("synchronize", pods=[pod_fields(p) for p in pods])
    async def run_pod_sandbox(self, pod):
        emit("run", **pod_fields(pod))
    async def stop_pod_sandbox(self, pod):
        emit("stop", **pod_fields(pod))
    async def remove_pod_sandbox(self, pod):
        emit("remove", **pod_fields(pod))

async def main():
    stub = Stub(Plugin(), name="wrong", idx="99")
    emit("start", pid=os.getpid(), name=stub.name, idx=stub.idx,
         preregistered=stub.preregistered,
         env={{k: os.environ.get(k) for k in
              ("NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX", "NRI_PLUGIN_SOCKET")}})
    try:
        await stub.run()
    finally:
        emit("exit")

asyncio.run(main())
"""


def _read_events(path: Path) -> list[dict]:
    return read_json_lines(path)


def _wait_events(path: Path, predicate, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        events = _read_events(path)
        if predicate(events):
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; {path} holds {events}")
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill_launched(path: Path) -> None:
    for ev in _read_events(path):
        if ev["kind"] == "start":
            try:
                os.kill(ev["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_preregistered_plugin_is_launched(bridge_network, make_containerd, tmp_path):
    plugin_dir = tmp_path / "nri-plugins"
    plugin_dir.mkdir()
    out = tmp_path / "launched-events.jsonl"
    launcher = plugin_dir / "10-nctlaunch"
    launcher.write_text(
        textwrap.dedent(LAUNCHER).format(python=sys.executable, repo=str(REPO_ROOT), out=str(out))
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    try:
        t0 = time.monotonic()
        ctd = make_containerd(cni_conf_dir=bridge_network.conf_dir, nri_plugin_path=plugin_dir)
        started = time.monotonic() - t0
        events = _wait_events(out, lambda evs: any(e["kind"] == "synchronize" for e in evs))
        start, configure, sync = events[:3]
        assert start["kind"] == "start"
        assert (start["name"], start["idx"], start["preregistered"]) == ("nctlaunch", "10", True)
        assert start["env"]["NRI_PLUGIN_SOCKET"] == "3"
        assert configure == {
            "kind": "configure",
            "runtime": "containerd",
            "request_timeout": 10000,
        }  # from config/containerd/nri.toml
        assert sync == {"kind": "synchronize", "pods": []}

        pod = ctd.cri.run_pod("launched-0", "nct-nri", "uid-l0")
        status = ctd.cri.pod_status(pod)
        ctd.cri.stop_pod(pod)
        ctd.cri.remove_pod(pod)
        events = _read_events(out)
        pod_events = [e for e in events if e.get("id") == pod]
        assert [e["kind"] for e in pod_events] == ["run", "stop", "remove"]
        assert all(
            (e["name"], e["namespace"], e["uid"]) == ("launched-0", "nct-nri", "uid-l0") for e in pod_events
        )
        assert pod_events[0]["netns"] == status.netns_path
        assert status.ip in pod_events[0]["ips"]

        # the launched plugin's connection ends with containerd, and so does the plugin
        ctd.stop()
        _wait_events(out, lambda evs: evs[-1]["kind"] == "exit")
        deadline = time.monotonic() + 60
        while _running(start["pid"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(start["pid"])
        print(f"containerd start with a launched plugin {started:.3f}s")
    finally:
        _kill_launched(out)
