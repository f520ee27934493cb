"""libcni cache interop, both ways, with a real bridge + portmap + firewall attachment.

1. An attachment made by running the plugin binaries directly (as containerd's libcni would),
   with a cache file written in libcni's exact layout: nri-cni reads it and its DEL removes
   everything. The DEL can only be complete if nri-cni took the cached capabilityArgs (portmap's
   DEL does nothing without portMappings) and the cached result as prevResult (firewall's DEL
   deletes the rules of the prevResult's IPs, nothing without one).
2. nri-cni's own cache file, parsed with libcni's field names and types, strictly, and
   compared byte for byte with what Go's encoding/json would write for the same values.
"""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest

from tests.integration.cni.helpers import CACHE_FIELDS, CniEnv, libcni_cache_bytes, random_port, run
from tests.support.conflists import bridge_plugin
from tests.support.firewall import iptables_lines
from tests.support.hostlocal import host_local_reservations
from tests.support.names import unique_name

pytestmark = pytest.mark.netns

# a value with characters Go escapes (<, >, &) and non-ASCII, to pin the encoding
NOTE = "a<b>&c-é"


def _conflist(env: CniEnv, bridge: str) -> dict:
    return env.conflist(
        bridge_plugin(bridge, env.host_local()),
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False, "backend": "iptables"},
        {"type": "firewall", "backend": "iptables"},
    )


def _setup(env: CniEnv, direct, bridge: str):
    """A real attachment made without nri-cni, and libcni's cache file for it."""
    conflist = _conflist(env, bridge)
    config = json.dumps(conflist, indent=2).encode()  # the conflist file's bytes
    host_port = random_port()
    caps = {
        "portMappings": [
            {"hostPort": host_port, "containerPort": 80, "protocol": "tcp", "hostIP": env.gateway}
        ]
    }
    args = [
        ("IgnoreUnknown", "1"),
        ("K8S_POD_NAMESPACE", "nct"),
        ("K8S_POD_NAME", "pod-i"),
        ("NCT_NOTE", NOTE),
    ]
    result = direct.add(conflist, env.cid, env.ns.path, "eth0", args, caps)
    results = env.cache_dir / "results"
    results.mkdir(parents=True, mode=0o700)
    path = results / f"{env.net_name}-{env.cid}-eth0"
    path.write_bytes(
        libcni_cache_bytes(
            container_id=env.cid,
            config=config,
            ifname="eth0",
            network=env.net_name,
            netns=env.ns.path,
            cni_args=args,
            capability_args=caps,
            result=result,
        )
    )
    path.chmod(0o600)
    pod_ip = next(ip["address"].split("/")[0] for ip in result["ips"])
    return conflist, config, caps, args, result, pod_ip, host_port


def _rules_present(pod_ip: str, host_port: int) -> tuple[bool, bool]:
    ipt = iptables_lines()
    dnat = any(f"--dport {host_port}" in ln and f"--to-destination {pod_ip}:80" in ln for ln in ipt)
    fw = any(f"{pod_ip}/32" in ln and "CNI-FORWARD" in ln for ln in ipt)
    return dnat, fw


def test_nri_cni_deletes_a_libcni_cached_attachment(cni_env: CniEnv, direct, ip_forward_restored):
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    leaks = env.leak_checker(bridges=[bridge]).start()
    conflist, config, caps, args, result, pod_ip, host_port = _setup(env, direct, bridge)
    try:
        leaks.add_markers(pod_ip)
        leaks.learn()
        assert _rules_present(pod_ip, host_port) == (True, True)

        rt = env.runtime()
        entries = rt.cache.entries(container_id=env.cid)
        assert len(entries) == 1
        e = entries[0]
        assert (e.container_id, e.ifname, e.network_name, e.netns) == (
            env.cid,
            "eth0",
            env.net_name,
            env.ns.path,
        )
        assert e.config == config
        assert [tuple(kv) for kv in e.cni_args] == args
        assert e.capability_args == caps
        assert e.result == result

        run(rt.delete_cached(e))
        assert _rules_present(pod_ip, host_port) == (False, False)
        assert host_local_reservations(env.data_dir) == []
        assert env.cache_files() == []
        leaks.assert_clean()
    finally:
        if env.cache_files():  # nri-cni failed: undo by hand
            direct.delete(conflist, env.cid, env.ns.path, "eth0", args, caps, prev=result)


def test_nri_cni_del_takes_prev_result_from_a_libcni_cache_file(cni_env: CniEnv, direct, ip_forward_restored):
    """The usual DEL (network from the config, runtime conf from the caller): the cached result
    written by "libcni" is the prevResult every plugin gets."""
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    leaks = env.leak_checker(bridges=[bridge]).start()
    conflist, config, caps, args, result, pod_ip, host_port = _setup(env, direct, bridge)
    try:
        leaks.add_markers(pod_ip)
        leaks.learn()
        rt = env.runtime()
        net = env.net(conflist)
        run(rt.check(net, env.rtconf(args=args, caps=caps)))  # CHECK needs the prevResult too
        run(rt.delete(net, env.rtconf(args=args, caps=caps)))
        assert _rules_present(pod_ip, host_port) == (False, False), "firewall DEL had no prevResult"
        leaks.assert_clean()
    finally:
        if env.cache_files():
            direct.delete(conflist, env.cid, env.ns.path, "eth0", args, caps, prev=result)


def test_nri_cni_cache_file_is_libcni_cached_info(cni_env: CniEnv, ip_forward_restored):
    from nri_cni.cni.result_parse import parse_result

    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    conflist = _conflist(env, bridge)
    config = (json.dumps(conflist, indent=4) + "\n").encode()
    src = env.tmp / "net.conflist"
    src.write_bytes(config)
    from nri_cni.cni.config import load_conflist_file

    net = load_conflist_file(src)
    caps = {
        "portMappings": [
            {"hostPort": random_port(), "containerPort": 80, "protocol": "tcp", "hostIP": env.gateway}
        ]
    }
    args = [("K8S_POD_NAMESPACE", "nct"), ("K8S_POD_NAME", "pod-j"), ("NCT_NOTE", NOTE)]
    rt = env.runtime()
    conf = env.rtconf(args=args, caps=caps)
    leaks = env.leak_checker(bridges=[bridge]).start()
    result = run(rt.add(net, conf))
    try:
        results_dir = env.cache_dir / "results"
        path = results_dir / f"{env.net_name}-{env.cid}-eth0"
        assert env.cache_files() == [path.name]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(results_dir).st_mode) == 0o700
        raw = path.read_bytes()

        # strict schema: libcni's cachedInfo field names, order and types, nothing else
        obj = json.loads(raw)
        keys = list(obj)
        assert set(keys) <= set(CACHE_FIELDS), f"unknown keys {set(keys) - set(CACHE_FIELDS)}"
        assert keys == [k for k in CACHE_FIELDS if k in obj], f"not in struct order: {keys}"
        for required in ("kind", "containerId", "config", "ifName", "networkName"):
            assert required in obj
        assert obj["kind"] == "cniCacheV1"
        assert obj["containerId"] == env.cid
        assert obj["ifName"] == "eth0"
        assert obj["networkName"] == env.net_name
        assert obj["netns"] == env.ns.path
        assert isinstance(obj["config"], str)
        assert base64.b64decode(obj["config"], validate=True) == config  # the file's bytes
        assert isinstance(obj["cniArgs"], list) and all(
            isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv)
            for kv in obj["cniArgs"]
        )
        assert [tuple(kv) for kv in obj["cniArgs"]] == args
        assert obj["capabilityArgs"] == caps
        assert isinstance(obj["result"], dict)
        assert obj["result"]["cniVersion"] == "1.1.0"
        assert parse_result(obj["result"]).to_dict() == result.to_dict()
        # byte for byte what Go would write for those values
        assert raw == libcni_cache_bytes(
            container_id=obj["containerId"],
            config=config,
            ifname=obj["ifName"],
            network=obj["networkName"],
            netns=obj["netns"],
            cni_args=obj["cniArgs"],
            capability_args=obj["capabilityArgs"],
            result=obj["result"],
        )
        assert b"\\u003c" in raw and b"<" not in raw  # Go's HTML escaping of NOTE
        pod_ip = next(ip.address.split("/")[0] for ip in result.ips)
        leaks.add_markers(pod_ip)
        leaks.learn()
    finally:
        run(rt.delete(net, conf))
    leaks.assert_clean()
