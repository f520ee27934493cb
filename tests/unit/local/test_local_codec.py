"""One codec for the local socket: the Python shim carries nri_cni/local/codec.py as it is and
imports nothing of the package; the daemon's protocol and the clients frame requests and
responses alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nri_cni.local import codec as localcodec
from nri_cni.local import proto as localproto
from nri_cni.shim import render

ROOT = Path(__file__).resolve().parents[3]


def test_the_python_shim_carries_the_shared_codec_and_imports_nothing_of_the_package():
    text = render("/run/x.sock", python="/usr/bin/python3")
    codec = (ROOT / "nri_cni" / "local" / "codec.py").read_text()
    assert codec in text
    tree = ast.parse(text)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in imports if isinstance(n, ast.ImportFrom)}
    assert names == {"_socket", "os", "sys"}


def test_server_and_clients_frame_alike():
    assert localproto.encode_request is localcodec.encode_request  # one encoder, re-exported
    request = localcodec.encode_request([("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c")], b"{}")
    assert request == b"\0\0\0\x21CNI_COMMAND=DEL\0CNI_CONTAINERID=c\0\0\0\x02{}"
    response = localproto.encode_response(1, b"err")
    assert localcodec.decode_response_head(response[: localcodec.RESPONSE_HEAD]) == (1, 3)
    with pytest.raises(localcodec.LocalProtocolError):
        localcodec.header_length((localcodec.MAX_HEADER + 1).to_bytes(4, "big"))
