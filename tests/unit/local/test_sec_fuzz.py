"""Property tests for every parser at the edge: random bytes and depth/size extremes
raise only the parser's own error, never anything else (RecursionError, KeyError, TypeError);
random NRI payloads are refused cleanly. (A running daemon under random requests:
tests/integration/local/test_daemon_under_random_requests.py.)"""

from __future__ import annotations

import asyncio
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.api import nri_pb2
from nri_cni.cni.cache import CacheEntry, CorruptEntry
from nri_cni.cni.config import parse_conflist
from nri_cni.cni.result_parse import parse_result
from nri_cni.errors import NriCniError
from nri_cni.local import proto as localproto
from nri_cni.pod.select import parse_annotation
from nri_cni.safety import validate
from tests.support.harness import new_pod_id, pod_message

FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
_deep = st.integers(1, 50_000).map(lambda n: "[" * n)
_text = st.one_of(st.text(max_size=200), _deep, st.text(alphabet='[]{}":,\\ 0a', max_size=400))
_bytes = st.one_of(st.binary(max_size=300), _text.map(lambda t: t.encode("utf-8", "surrogatepass")))


@FAST
@given(value=_text)
def test_annotation_parser(value):
    try:
        parse_annotation(value)
    except NriCniError:
        pass


@FAST
@given(data=_bytes)
def test_plugin_result_parser(data):
    try:
        parse_result(data, "1.1.0")
    except NriCniError:
        pass


@FAST
@given(data=_bytes)
def test_conflist_parser(data):
    try:
        parse_conflist(data, "fuzz")
    except NriCniError:
        pass


@FAST
@given(data=_bytes)
def test_cache_entry_parser(data):
    try:
        CacheEntry.from_json(data, "fuzz")
    except CorruptEntry:
        pass


@FAST
@given(text=st.text(max_size=300))
def test_cni_args_and_id_and_ifname_checks(text):
    for check in (validate.cni_args_pairs, validate.check_id, validate.check_ifname):
        try:
            check(text)
        except validate.InvalidInput as exc:
            assert len(str(exc)) < 1200  # quoted input is cut
    if validate.is_valid_id(text):
        assert "/" not in text and text not in (".", "..")


@FAST
@given(data=st.binary(max_size=300))
def test_local_protocol_reader(data):
    async def read():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        try:
            await localproto.read_request(reader)
        except localproto.LocalProtocolError:
            pass

    asyncio.run(read())


def test_random_nri_payloads_are_refused_cleanly():
    from nri_cni.nri.plugin_service import PluginService

    class Plugin:
        async def run_pod_sandbox(self, pod):
            validate.check_id(pod.id)

    service = PluginService(Plugin(), on_configured=lambda req: None, on_synchronized=lambda: None)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.one_of(st.binary(max_size=200), st.just(struct.pack(">I", 5))))
    def feed(data):
        for handler in (service.run_pod_sandbox, service.state_change, service.synchronize):
            try:
                asyncio.run(handler(data))
            except NriCniError:
                pass

    feed()
    ok = nri_pb2.RunPodSandboxRequest(pod=pod_message(new_pod_id(), "/x")).SerializeToString()
    asyncio.run(service.run_pod_sandbox(ok))
