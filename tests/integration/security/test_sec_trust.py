"""Trust of files: a plugin binary, or a network list, in a directory other users can
write (or owned by another user) is refused with an error naming the path and its mode;
`files.trust: warn` turns that into a warning for development."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
import yaml

from nri_cni.config import load_config
from nri_cni.errors import ConfigError
from tests.support.harness import new_pod_id, run
from tests.support.secharness import call_shim, install_shim, netns_path, normal_add_del, pod_calls, started

pytestmark = pytest.mark.netns  # a daemon, network namespaces, root


@pytest.mark.parametrize("how", ["dir-0777", "file-0666", "owner-65534"])
def test_a_plugin_others_can_replace_is_not_run(node, how):
    netns_path(node)
    target = node.bin_dir / "fake-ok"
    if how == "dir-0777":
        os.chmod(node.bin_dir, 0o777)
    elif how == "file-0666":
        os.chmod(target, 0o777)
    else:
        os.chown(target, 65534, 65534)

    async def scenario():
        h = await started(node, node.config("shim", [_net(node)]))
        try:
            shim = install_shim(node, True)
            code, out, raw = await call_shim(shim, "ADD", new_pod_id(), netns=netns_path(node))
            assert code == 1 and "not trusted" in raw.decode(), raw
            assert ("mode 0777" in raw.decode()) or ("uid 65534" in raw.decode()), raw
            assert not pod_calls(node)
        finally:
            await h.stop()

    run(scenario())


def test_files_trust_warn_runs_it_with_a_warning(node, caplog):
    netns_path(node)
    os.chmod(node.bin_dir, 0o777)

    async def scenario():
        h = await started(node, node.config("shim", [_net(node)], files={"trust": "warn"}))
        try:
            await normal_add_del(install_shim(node, True), node, new_pod_id())
        finally:
            await h.stop()

    run(scenario())
    assert any("trusted anyway" in r.getMessage() for r in caplog.records)


def test_a_network_list_in_a_world_writable_dir_is_refused_at_load_and_at_reload(node):
    netns_path(node)
    confdir = node.tmp / "conf"
    confdir.mkdir()
    conflist = confdir / "podnet.conflist"
    body = {"cniVersion": "1.1.0", "name": "podnet", "plugins": [node.fake("fake-ok")]}
    conflist.write_text(json.dumps(body))
    cfg = node.config(
        "shim",
        [{"name": "podnet", "default": True, "file": str(conflist)}],
        reload={"watch": True, "rescan_interval": 0, "debounce": "50ms"},
    )
    path = node.tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    load_config(str(path))  # trusted as it is

    async def scenario():
        h = await started(node, cfg)
        try:
            state = h.daemon.reloader.state
            os.chmod(confdir, 0o777)
            refused = state.refused_at
            evil = {**body, "plugins": [node.fake("fake-finalize")]}
            conflist.write_text(json.dumps(evil))  # "another user" rewrote it
            deadline = time.monotonic() + 60
            while state.refused_at == refused:
                assert time.monotonic() < deadline, "the change was not refused"
                await asyncio.sleep(0.02)
            assert "not trusted" in state.refused and "0777" in state.refused
            code, _, raw = await call_shim(
                install_shim(node, True), "ADD", new_pod_id(), netns=netns_path(node)
            )
            assert code == 0, raw
            assert {c["type"] for c in pod_calls(node)} == {"fake-ok"}
        finally:
            os.chmod(confdir, 0o755)
            await h.stop()

    run(scenario())
    os.chmod(confdir, 0o777)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "not trusted" in str(err.value) and str(confdir) in str(err.value)


def _net(node) -> dict:
    return {
        "name": "podnet",
        "default": True,
        "conflist": {"cniVersion": "1.1.0", "name": "podnet", "plugins": [node.fake("fake-ok")]},
    }


def test_a_finalize_dropin_others_can_write_is_skipped(node):
    netns_path(node)
    dropin = node.finalize_dir / "50-extra.conf"
    dropin.write_text(json.dumps(node.fake("fake-finalize2")))
    os.chmod(node.finalize_dir, 0o777)

    async def scenario():
        h = await started(node, node.config("shim", [_net(node)]))
        try:
            await normal_add_del(install_shim(node, True), node, new_pod_id())
            assert "fake-finalize2" not in {c["type"] for c in pod_calls(node)}
        finally:
            os.chmod(node.finalize_dir, 0o755)
            await h.stop()

    run(scenario())
