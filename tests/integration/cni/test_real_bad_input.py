"""Bad input through the real runtime: a clear error, and nothing left behind (no link in the
netns, no host-local reservation, no cache file, nothing executed that should not be)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.integration.cni.helpers import CniEnv, run
from tests.support.conflists import bridge_plugin
from tests.support.hostlocal import host_local_reservations
from tests.support.names import unique_name

pytestmark = pytest.mark.netns


def _assert_nothing_left(env: CniEnv, net_name: str) -> None:
    assert [li.name for li in env.ns.links()] == ["lo"], "links left in the netns"
    assert host_local_reservations(env.data_dir) == [], "host-local reservation left"
    assert env.cache_files() == [], f"cache files left for {net_name}"


def _bridge(env: CniEnv, bridge: str) -> dict:
    return bridge_plugin(bridge, env.host_local(), gateway=False)


def test_missing_plugin_binary_in_the_chain(cni_env: CniEnv):
    """The second plugin of the list is not installed. libcni would run bridge first and leave
    its veth and address until a DEL that itself fails on the missing binary (DEL runs in
    reverse, so it stops before reaching bridge: kubernetes#80482). Nothing may be left."""
    from nri_cni.errors import PluginExecError

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    net = env.net(env.conflist(_bridge(env, bridge), {"type": "nct-not-installed"}))
    leaks = env.leak_checker(bridges=[bridge]).start()
    rt = env.runtime()
    try:
        with pytest.raises(PluginExecError) as ei:
            run(rt.add(net, env.rtconf()))
        assert "nct-not-installed" in str(ei.value)
        assert ei.value.ref.command == "ADD"
        _assert_nothing_left(env, net.name)
        leaks.assert_clean()
    finally:
        # whatever happened, undo what the chain made (bridge ran, if the runtime let it)
        try:
            run(rt.delete(env.net(env.conflist(_bridge(env, bridge))), env.rtconf()))
        except Exception:
            pass


def test_plugin_type_with_a_path_is_refused(cni_env: CniEnv, tmp_path):
    """`type` "../../bin/sh" (or any path) never reaches exec: refused when the list is parsed,
    and refused by the runtime for a list built by hand."""
    from nri_cni.cni.config import NetworkConfigList, PluginConf
    from nri_cni.errors import ConfigError, NriCniError

    env = cni_env
    with pytest.raises(ConfigError) as ei:
        env.net(env.conflist({"type": "../../bin/sh"}))
    assert "../../bin/sh" in str(ei.value)

    # a canary one level above a bin dir: "../canary" would run it if paths were joined
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(os.path.join(env.bin_dir, "bridge"), bin_dir / "bridge")
    ran = tmp_path / "canary-ran"
    canary = tmp_path / "canary"
    canary.write_text(f"#!/bin/sh\ntouch {ran}\necho '{{}}'\n")
    canary.chmod(canary.stat().st_mode | stat.S_IXUSR)

    from nri_cni.cni.exec import PluginExecutor
    from nri_cni.cni.runtime import CNIRuntime

    rt = CNIRuntime([str(bin_dir)], cache_dir=str(env.cache_dir), executor=PluginExecutor())
    for evil in ("../canary", str(canary), "../../bin/sh"):
        raw = {"cniVersion": "1.1.0", "name": env.net_name, "plugins": [{"type": evil}]}
        net = NetworkConfigList(
            name=env.net_name,
            cni_version="1.1.0",
            plugins=(PluginConf(type=evil, conf=raw["plugins"][0]),),
            raw=raw,
            bytes=json.dumps(raw).encode(),
            source="test",
        )
        for verb in (rt.add, rt.check, rt.delete):
            with pytest.raises(NriCniError) as ei:
                run(verb(net, env.rtconf()))
            assert evil in str(ei.value), ei.value
        with pytest.raises(NriCniError):
            run(rt.status(net))
    assert not ran.exists(), "a plugin type with a path was executed"
    _assert_nothing_left(env, env.net_name)


@pytest.mark.parametrize("pod_name", ["web;IP=10.247.0.99", "a=b", "x;y"])
def test_pod_name_with_separator_is_refused(cni_env: CniEnv, pod_name: str):
    """K8S_POD_NAME carrying ';' or '=' would let a pod smuggle CNI_ARGS keys (IP=...) into
    every plugin: refused before any plugin runs."""
    from nri_cni.errors import ConfigError

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    net = env.net(env.conflist(_bridge(env, bridge)))
    leaks = env.leak_checker(bridges=[bridge]).start()
    rt = env.runtime()
    conf = env.rtconf(args=[("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", pod_name)])
    with pytest.raises(ConfigError) as ei:
        run(rt.add(net, conf))
    assert "K8S_POD_NAME" in str(ei.value)
    assert not os.path.exists(f"/sys/class/net/{bridge}"), "bridge ran"
    _assert_nothing_left(env, net.name)
    leaks.assert_clean()
