"""The shim: where it connects is the top-level `daemonSocket` of its config or the
built-in default, never a key nested in runtimeConfig (a pod annotation), in the C and the
Python builds alike. The property tests feed both builds random configs and compare the socket
each picks (named in its "not reachable" error) with the top level as json.loads reads it. (issue 15)"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_cni.local import proto as localproto
from tests.support.harness import new_pod_id, run
from tests.support.secharness import (
    BUILDS,
    PATH,
    call_shim,
    install_shim,
    netns_path,
    normal_add_del,
    pod_calls,
    runtime_conf,
    shim_config,
    started,
)

FORGED = b'{"cniVersion":"1.0.0","ips":[{"address":"6.6.6.6/32"}]}'


@pytest.mark.netns
@BUILDS
def test_an_annotation_named_daemonsocket_does_not_redirect_the_shim(node, compiled):
    evil = node.tmp / "evil.sock"
    seen: list[dict] = []
    netns_path(node)

    async def scenario():
        async def forge(reader, writer):
            header, _ = await localproto.read_request(reader)
            seen.append(header)
            writer.write(localproto.encode_response(0, FORGED))
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(forge, path=str(evil))
        h = await started(node, shim_config(node))
        try:
            shim = install_shim(node, compiled)
            netns = netns_path(node)
            cid = new_pod_id()
            for conf in (
                runtime_conf({"daemonSocket": str(evil)}),
                runtime_conf({"x": json.dumps({"daemonSocket": str(evil)})}),
                {**runtime_conf(), "args": {"daemonSocket": str(evil)}},
            ):
                code, out, raw = await call_shim(shim, "ADD", cid, conf=conf, netns=netns)
                assert code == 0, raw
                assert "6.6.6.6" not in raw.decode(), raw
                code, _, raw = await call_shim(shim, "DEL", cid, conf=conf, netns=netns)
                assert code == 0, raw
            assert seen == []
            assert [c["command"] for c in pod_calls(node)] == ["ADD", "DEL"] * 3
            await normal_add_del(shim, node, new_pod_id())
        finally:
            await h.stop()
            server.close()

    run(scenario())


# -- property tests: the socket each build picks -------------------------------------------

DEFAULT = "/nonexistent/nri-cni-default.sock"
_keys = st.sampled_from(["daemonSocket", "cniVersion", "name", "daemon\u0053ocket", "x", ""])
_scalars = st.one_of(
    st.none(),
    st.sampled_from(["1.0.0", "0.4.0", "1.1.0", "99.99.99"]),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=8,
)
_paths = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40).map(
    lambda s: "/nonexistent/" + s.replace("/", "_")
)


def _pick(compiled: bool, shims: dict, body: bytes) -> tuple[str, str]:
    """(the socket the shim tried, the cniVersion it answered with)."""
    proc = subprocess.run(
        [shims[compiled]],
        input=body,
        env={"PATH": PATH, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1"},
        capture_output=True,
        timeout=30,
    )
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 11, proc.stdout
    prefix = "nri-cni daemon is not reachable at "
    assert err["msg"].startswith(prefix), err
    return err["msg"][len(prefix) :], err["cniVersion"]


def _expected(doc) -> tuple[str, str | None]:
    if not isinstance(doc, dict):
        return DEFAULT, None
    sock = doc.get("daemonSocket")
    version = doc.get("cniVersion")
    return (
        sock if isinstance(sock, str) and sock else DEFAULT,
        version
        if isinstance(version, str) and 0 < len(version) <= 16 and not version.strip("0123456789.")
        else None,
    )


def _shims(tmp_path_factory) -> dict:
    from nri_cni.shim import install

    base = tmp_path_factory.mktemp("shims")
    return {c: install(str(base / str(c)), DEFAULT, compiled=c) for c in (True, False)}


def test_shims_pick_the_top_level_daemonsocket_of_any_config(tmp_path_factory):
    shims = _shims(tmp_path_factory)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        top=st.dictionaries(_keys, _values, max_size=5),
        sock=st.one_of(st.none(), _paths),
        nested=_paths,
        ascii_only=st.booleans(),
        spaced=st.booleans(),
    )
    def check(top, sock, nested, ascii_only, spaced):
        doc = dict(top)
        doc["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {"daemonSocket": nested}}
        if sock is not None:
            doc["daemonSocket"] = sock
        body = json.dumps(doc, ensure_ascii=ascii_only, indent=1 if spaced else None).encode()
        want_sock, want_version = _expected(json.loads(body))
        if len(want_sock.encode()) >= 108:
            return
        for compiled in (True, False):
            got_sock, got_version = _pick(compiled, shims, body)
            assert got_sock == want_sock, (compiled, body)
            assert got_version == (want_version or "1.0.0"), (compiled, body)

    check()


def test_shims_fall_back_to_the_default_on_any_bytes(tmp_path_factory):
    shims = _shims(tmp_path_factory)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        body=st.one_of(
            st.binary(max_size=200),
            st.builds(lambda b: b'{"daemonSocket":"/nonexistent/x",' + b, st.binary(max_size=50)),
            st.integers(1, 20000).map(lambda n: b'{"a":' + b"[" * n + b'"daemonSocket":"/x"'),
        )
    )
    def check(body):
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        want_sock, _ = _expected(doc)
        for compiled in (True, False):
            got_sock, _ = _pick(compiled, shims, body)
            assert got_sock == want_sock, (compiled, body[:200])

    check()
