"""The socket each shim build picks, property-tested: both builds are fed random configs and
random bytes, and the socket each tries (named in its "not reachable" error) is the top-level
`daemonSocket` as json.loads reads it, or the built-in default; never a nested key. (A running
daemon and a forged one: tests/integration/shim/test_shim_socket_not_from_annotations.py.)"""

from __future__ import annotations

import json
import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.secharness import PATH

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
