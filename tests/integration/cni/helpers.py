"""Helpers of the real-plugin CNI tests: the per-test environment, netlink checks of a
result, a direct driver that runs the plugin binaries by hand (as libcni would), and libcni's cache
file written the way Go writes it."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import random
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.janitor import Janitor
from tests.support.leaks import LeakChecker
from tests.support.netns import Netns, get_link

CNI_VERSION = "1.1.0"


def run(coro):
    """Run one coroutine of the runtime to completion (each test verb gets a fresh loop)."""
    return asyncio.run(coro)


@dataclass
class CniEnv:
    tmp: Path
    bin_dir: str
    jan: Janitor
    ns: Netns
    subnet: ipaddress.IPv4Network
    net_name: str
    cid: str
    cache_dir: Path
    data_dir: Path
    tuning_dir: Path
    cids: list[str] = field(default_factory=list)  # more container IDs the test made

    # addresses of the subnet
    def host(self, n: int) -> str:
        return str(self.subnet.network_address + n)

    @property
    def gateway(self) -> str:
        return self.host(1)

    def cidr(self, n: int) -> str:
        return f"{self.host(n)}/{self.subnet.prefixlen}"

    def runtime(self, **kw):
        from nri_cni.cni.exec import PluginExecutor
        from nri_cni.cni.runtime import CNIRuntime

        return CNIRuntime([self.bin_dir], cache_dir=str(self.cache_dir), **kw, executor=PluginExecutor())

    def rtconf(
        self,
        *,
        cid: str | None = None,
        ns: Netns | None = None,
        ifname: str = "eth0",
        args=(),
        caps: dict | None = None,
    ):
        from nri_cni.cni.runtime import RuntimeConf

        return RuntimeConf(
            container_id=cid or self.cid,
            netns=(ns or self.ns).path,
            ifname=ifname,
            args=list(args),
            capability_args=dict(caps or {}),
        )

    def new_netns(self) -> Netns:
        return self.jan.netns()

    def new_cid(self) -> str:
        cid = "nct-" + uuid.uuid4().hex
        self.cids.append(cid)
        return cid

    def leak_checker(self, *, netns=None, bridges=(), markers=(), dirs=None, **kw) -> LeakChecker:
        return LeakChecker(
            markers=[self.cid, self.net_name, *markers],
            dirs=dirs if dirs is not None else [self.cache_dir, self.data_dir, self.tuning_dir],
            netns=netns if netns is not None else [self.ns],
            bridges=bridges,
            **kw,
        )

    def cache_files(self) -> list[str]:
        d = self.cache_dir / "results"
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    # conflist pieces

    def host_local(self, **kw) -> dict:
        rng = {"subnet": str(self.subnet)}
        rng.update(kw.pop("range", {}))
        ipam = {"type": "host-local", "ranges": [[rng]], "dataDir": str(self.data_dir)}
        ipam.update(kw)
        return ipam

    def conflist(self, *plugins: dict, name: str | None = None, **top) -> dict:
        return {"cniVersion": CNI_VERSION, "name": name or self.net_name, **top, "plugins": list(plugins)}

    def net(self, conflist: dict):
        from nri_cni.cni.config import parse_conflist

        return parse_conflist(json.dumps(conflist).encode(), source=f"test:{self.net_name}")


def random_port() -> int:
    return random.randint(20000, 29999)


# --------------------------------------------------------------------------------------------
# netlink checks of a result


def assert_result_matches_netlink(result, env: CniEnv, *, expect_sandbox_ifname: str = "eth0"):
    """Every interface the result names exists where it says, with the MAC it says; every IP
    the result lists is on the interface it points at."""
    assert result.interfaces, "result lists no interface"
    found_sandbox = False
    for iface in result.interfaces:
        if iface.sandbox:
            assert iface.sandbox == env.ns.path, f"{iface.name} claims sandbox {iface.sandbox}"
            link = get_link(iface.name, env.ns)
            found_sandbox = found_sandbox or iface.name == expect_sandbox_ifname
        else:
            link = get_link(iface.name)
        assert link is not None, f"result interface {iface.name} (sandbox {iface.sandbox!r}) missing"
        if iface.mac:
            assert link.mac == iface.mac.lower(), f"{iface.name}: mac {link.mac} != result {iface.mac}"
        if iface.mtu:
            assert link.mtu == iface.mtu
    assert found_sandbox, f"no {expect_sandbox_ifname} in the sandbox among {result.interfaces}"
    assert result.ips, "result lists no IP"
    for ip in result.ips:
        assert ip.interface is not None, f"{ip} has no interface index"
        iface = result.interfaces[ip.interface]
        ns = env.ns if iface.sandbox else None
        link = get_link(iface.name, ns)
        assert link is not None and link.has_addr(ip.address), (
            f"{ip.address} not on {iface.name}: {link.addrs if link else None}"
        )


# --------------------------------------------------------------------------------------------
# the direct driver: the plugin binaries run by hand, as libcni would run them


class DirectCNI:
    """Runs a conflist's plugins with subprocess.run, injecting name, cniVersion, runtimeConfig
    (declared capabilities only) and prevResult the way libcni does. No cache."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir

    def _stdin(self, conflist: dict, plugin: dict, caps: dict, prev: dict | None) -> bytes:
        conf = dict(plugin)
        conf["name"] = conflist["name"]
        conf["cniVersion"] = conflist["cniVersion"]
        rc = {k: caps[k] for k, on in (plugin.get("capabilities") or {}).items() if on and k in caps}
        if rc:
            conf["runtimeConfig"] = rc
        if prev is not None:
            conf["prevResult"] = prev
        return json.dumps(conf).encode()

    def call(
        self,
        command: str,
        plugin_type: str,
        stdin: bytes,
        cid: str,
        netns: str,
        ifname: str,
        cni_args: list[tuple[str, str]],
    ) -> dict | None:
        env = dict(os.environ)
        env.update(
            CNI_COMMAND=command,
            CNI_CONTAINERID=cid,
            CNI_NETNS=netns,
            CNI_IFNAME=ifname,
            CNI_ARGS=";".join(f"{k}={v}" for k, v in cni_args),
            CNI_PATH=self.bin_dir,
        )
        p = subprocess.run(
            [os.path.join(self.bin_dir, plugin_type)], input=stdin, env=env, capture_output=True, timeout=60
        )
        if p.returncode != 0:
            raise RuntimeError(
                f"{plugin_type} {command} failed ({p.returncode}): "
                f"{p.stdout.decode(errors='replace')} {p.stderr.decode(errors='replace')}"
            )
        return json.loads(p.stdout) if p.stdout.strip() else None

    def add(
        self,
        conflist: dict,
        cid: str,
        netns: str,
        ifname: str = "eth0",
        cni_args=(),
        caps: dict | None = None,
    ) -> dict:
        prev = None
        for plugin in conflist["plugins"]:
            prev = self.call(
                "ADD",
                plugin["type"],
                self._stdin(conflist, plugin, caps or {}, prev),
                cid,
                netns,
                ifname,
                list(cni_args),
            )
        assert prev is not None
        return prev

    def delete(
        self,
        conflist: dict,
        cid: str,
        netns: str,
        ifname: str = "eth0",
        cni_args=(),
        caps: dict | None = None,
        prev: dict | None = None,
    ) -> None:
        for plugin in reversed(conflist["plugins"]):
            self.call(
                "DEL",
                plugin["type"],
                self._stdin(conflist, plugin, caps or {}, prev),
                cid,
                netns,
                ifname,
                list(cni_args),
            )


# --------------------------------------------------------------------------------------------
# libcni's cache file, written the way Go's encoding/json writes libcni's cachedInfo


def go_json(value) -> str:
    """Go's json.Marshal of a value decoded into interface{}: compact, map keys sorted,
    <, >, & and U+2028/2029 escaped, non-ASCII kept as UTF-8."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for ch, esc in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text


CACHE_FIELDS = (
    "kind",
    "containerId",
    "config",
    "ifName",
    "networkName",
    "netns",
    "cniArgs",
    "capabilityArgs",
    "result",
)


def libcni_cache_bytes(
    *,
    container_id: str,
    config: bytes,
    ifname: str,
    network: str,
    netns: str = "",
    cni_args=(),
    capability_args: dict | None = None,
    result: dict | None = None,
) -> bytes:
    """cachedInfo{Kind, ContainerID, Config []byte, IfName, NetworkName, NetNS omitempty,
    CniArgs [][2]string omitempty, CapabilityArgs map omitempty, RawResult map omitempty},
    in struct field order."""
    parts = [
        f'"kind":{go_json("cniCacheV1")}',
        f'"containerId":{go_json(container_id)}',
        f'"config":"{base64.b64encode(config).decode()}"',
        f'"ifName":{go_json(ifname)}',
        f'"networkName":{go_json(network)}',
    ]
    if netns:
        parts.append(f'"netns":{go_json(netns)}')
    if cni_args:
        parts.append(f'"cniArgs":{go_json([list(kv) for kv in cni_args])}')
    if capability_args:
        parts.append(f'"capabilityArgs":{go_json(capability_args)}')
    if result:
        parts.append(f'"result":{go_json(result)}')
    return ("{" + ",".join(parts) + "}").encode()
