"""A running daemon keeps answering normal ADD/DELs from the shim during and after random and
extreme requests on its local socket (random headers and bodies, garbage, half a request) and
random pod events through NRI; the refused input leaves nothing outside its state dirs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.errors import NriCniError
from nri_cni.local import proto as localproto
from nri_cni.safety import validate
from tests.support.harness import DaemonHarness, new_pod_id, pod_message, run
from tests.support.secharness import (
    all_files,
    call_shim,
    fake_net,
    install_shim,
    netns_path,
    normal_add_del,
    shim_config,
    started,
)

_deep = st.integers(1, 50_000).map(lambda n: "[" * n)


@pytest.mark.netns
def test_the_daemon_answers_while_random_requests_hit_the_local_socket(node):
    """Random and extreme requests on the local socket, interleaved with normal ADD/DELs."""
    netns_path(node)
    shim_holder = {}

    async def scenario():
        h = await started(node, node.config("shim", [fake_net(node)]))
        try:
            shim_holder["shim"] = install_shim(node, True)
            sock = str(node.tmp / "daemon.sock")
            bodies = [
                b"\xff" * 64,
                localproto.encode_request([("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "a")], b"[" * 100_000),
                localproto.encode_request([("CNI_COMMAND", "GC")], b'{"cni.dev/valid-attachments":{}}'),
                localproto.encode_request([("NRICNI_OP", "nope")]),
                b"\x00\x00\x00\x05CNI_C",  # half a request, then the client goes away
            ]
            for body in bodies:
                reader, writer = await asyncio.open_unix_connection(sock)
                writer.write(body)
                await writer.drain()
                writer.close()
                await normal_add_del(shim_holder["shim"], node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())


class _DaemonThread:
    """The in-process daemon on a loop of its own, so hypothesis can drive it synchronously."""

    def __init__(self, node, cfg) -> None:
        self.node, self.cfg = node, cfg
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.harness: DaemonHarness | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.harness = self.loop.run_until_complete(DaemonHarness(self.node, self.cfg).start())
        except BaseException as exc:
            self.error = exc
        self.ready.set()
        if self.error is None:
            self.loop.run_forever()

    def start(self) -> _DaemonThread:
        self.thread.start()
        self.ready.wait(30)
        if self.error is not None:
            raise self.error
        return self

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.harness is not None:
            self.call(self.harness.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def _raw_request(path: str, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(path)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass  # refused mid-way: the daemon closed on us


_headers = st.dictionaries(
    st.sampled_from(
        ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS", "CNI_NETNS", "NRICNI_OP", "X"]
    ),
    st.one_of(
        st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "status", "pods"]), st.text(max_size=40)
    ),
    max_size=6,
)
_bodies = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda rc: json.dumps({"cniVersion": "1.0.0", "runtimeConfig": rc}),
        st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=5), st.integers(), st.booleans()),
    ).map(str.encode),
    _deep.map(str.encode),
    st.builds(
        lambda ann: json.dumps(
            {"cniVersion": "1.0.0", "runtimeConfig": {"io.kubernetes.cri.pod-annotations": ann}}
        ),
        st.dictionaries(st.text(max_size=30), st.text(max_size=60), max_size=3),
    ).map(str.encode),
)


@pytest.mark.netns
def test_the_daemon_keeps_answering_during_and_after_random_requests(node):
    netns = netns_path(node)
    d = _DaemonThread(node, shim_config(node)).start()
    shim = install_shim(node, True)
    sock = str(node.tmp / "daemon.sock")

    def normal() -> None:
        cid = new_pod_id()
        code, _, raw = d.call(call_shim(shim, "ADD", cid, netns=netns))
        assert code == 0, raw
        code, _, raw = d.call(call_shim(shim, "DEL", cid, netns=netns))
        assert code == 0, raw

    examples: list[int] = []

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        header=_headers,
        body=_bodies,
        garbage=st.one_of(st.none(), st.binary(max_size=64)),
        pod_id=st.one_of(st.text(max_size=80), st.sampled_from(["../x", "/etc/passwd", ".", "a" * 200])),
        pod_name=st.text(max_size=30),
    )
    def hit(header, body, garbage, pod_id, pod_name):
        examples.append(1)
        if len(examples) % 25 == 0:
            normal()  # during, not only before and after
        if garbage is not None:
            _raw_request(sock, garbage)
        else:
            header = {k: v.replace("\0", "") for k, v in header.items()}
            header.pop("NRICNI_OP", None) if header.get("NRICNI_OP") == "gc" else None
            if header.get("CNI_COMMAND") == "GC":
                header["CNI_COMMAND"] = "CHECK"  # a real GC would collect the test's own pods
            _raw_request(sock, localproto.encode_request(list(header.items()), body))
        pod = pod_message("x", netns, name="p")
        pod.id, pod.name = pod_id, pod_name
        for event in (d.harness.runtime.run_pod_sandbox, d.harness.runtime.stop_pod_sandbox):
            try:
                d.call(event(pod))
            except NriCniError:
                pass

    def outside() -> set[str]:
        mine = ("state", "cache", "fake.log", "daemon.sock")
        return {f for f in all_files(node.tmp) if not f.startswith(mine)}

    try:
        normal()
        before = outside()
        hit()
        normal()
        assert outside() == before  # nothing outside the state dirs was touched
        # nothing was left behind by the refused input
        assert (
            not list((node.state_dir / "intents").glob("*"))
            if (node.state_dir / "intents").exists()
            else True
        )
        # random ADDs with valid ids may attach for real; nothing else is in the cache dir
        results = node.cache_dir / "results"
        for entry in results.iterdir() if results.exists() else []:
            cid = entry.name.split("-", 1)[1].rsplit("-", 1)[0]
            assert entry.name.startswith("podnet-") and validate.is_valid_id(cid), entry.name
    finally:
        d.stop()
