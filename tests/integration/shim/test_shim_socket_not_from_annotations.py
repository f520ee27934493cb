"""The shim connects to the top-level `daemonSocket` of its config or the built-in default,
never to a key nested in runtimeConfig (a pod annotation), in the C and the Python builds alike:
a forged daemon behind such a key sees no request and its result never reaches the runtime."""

from __future__ import annotations

import asyncio
import json

import pytest

from nri_cni.local import proto as localproto
from tests.support.harness import new_pod_id, run
from tests.support.secharness import (
    BUILDS,
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
