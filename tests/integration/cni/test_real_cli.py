"""`nri-cni cni ...` (the cnitool-like CLI) in a subprocess, with the real plugins."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.integration.cni.helpers import CniEnv, random_port
from tests.support.conflists import bridge_plugin
from tests.support.hostlocal import host_local_reservations
from tests.support.names import unique_name

pytestmark = pytest.mark.netns


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.pop("CNI_ARGS", None)
    full_env.pop("CAP_ARGS", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "cni", *argv],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


def last_json(stderr: str) -> dict:
    """The CNI error object: the last line of stderr, the only JSON there."""
    lines = stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    return json.loads(lines[-1])


def test_cli_add_check_del(cni_env: CniEnv, ip_forward_restored):
    env = cni_env
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    confdir = env.tmp / "net.d"
    confdir.mkdir()
    conflist = env.conflist(
        bridge_plugin(bridge, env.host_local()),
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
    )
    (confdir / "10-nct.conflist").write_text(json.dumps(conflist))
    (confdir / "20-other.conflist").write_text(
        json.dumps(env.conflist({"type": "loopback"}, name="nct-other"))
    )
    common = ["--conf-dir", str(confdir), "--bin-dir", env.bin_dir, "--cache-dir", str(env.cache_dir)]
    caps = {
        "portMappings": [
            {"hostPort": random_port(), "containerPort": 80, "protocol": "tcp", "hostIP": env.gateway}
        ]
    }
    leaks = env.leak_checker(bridges=[bridge]).start()

    p = cli(
        "add",
        env.net_name,
        env.ns.path,
        *common,
        "--args",
        "K8S_POD_NAME=cli;K8S_POD_NAMESPACE=nct",
        "--cap-args",
        json.dumps(caps),
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["cniVersion"] == "1.1.0"
    sandbox = [i for i in result["interfaces"] if i.get("sandbox") == env.ns.path]
    assert [i["name"] for i in sandbox] == ["eth0"]
    eth0 = env.ns.link("eth0")
    assert eth0.mac == sandbox[0]["mac"].lower()
    pod_cidr = result["ips"][0]["address"]
    assert eth0.has_addr(pod_cidr)
    pod_ip = pod_cidr.split("/")[0]

    # cnitool's container ID, so cnitool and nri-cni share cache entries
    cid = "cnitool-" + hashlib.sha512(env.ns.path.encode()).hexdigest()[:20]
    assert env.cache_files() == [f"{env.net_name}-{cid}-eth0"]
    assert [(r.ip, r.container_id) for r in host_local_reservations(env.data_dir)] == [(pod_ip, cid)]
    cached = json.loads((env.cache_dir / "results" / env.cache_files()[0]).read_text())
    assert cached["cniArgs"] == [["K8S_POD_NAME", "cli"], ["K8S_POD_NAMESPACE", "nct"]]
    assert cached["capabilityArgs"] == caps
    leaks.add_markers(cid, pod_ip)
    leaks.learn()

    p = cli("check", env.net_name, env.ns.path, *common, "--cap-args", json.dumps(caps))
    assert (p.returncode, p.stdout) == (0, ""), p.stderr
    p = cli("status", env.net_name, *common)
    assert (p.returncode, p.stdout) == (0, ""), p.stderr
    p = cli("del", env.net_name, env.ns.path, *common, env={"CAP_ARGS": json.dumps(caps)})
    assert (p.returncode, p.stdout) == (0, ""), p.stderr
    leaks.assert_clean()


def test_cli_errors_are_cni_error_json(cni_env: CniEnv):
    from nri_cni.cli.main import EXIT_PLUGIN, EXIT_USAGE

    env = cni_env
    confdir = env.tmp / "net.d"
    confdir.mkdir()
    bridge = unique_name("br")
    env.jan.track_link(bridge)
    (confdir / "10-bad.conflist").write_text(
        json.dumps(
            env.conflist(
                {"type": "bridge", "bridge": bridge, "ipMasq": False, "ipam": {"type": "nct-no-ipam"}}
            )
        )
    )
    common = ["--conf-dir", str(confdir), "--bin-dir", env.bin_dir, "--cache-dir", str(env.cache_dir)]

    # an unknown network: a config error, exit 2
    p = cli("add", "nct-nowhere", env.ns.path, *common)
    assert p.returncode == EXIT_USAGE and p.stdout == ""
    err = last_json(p.stderr)
    assert err["code"] == 7 and "nct-nowhere" in err["msg"], err

    # a bad --args pair: refused before anything runs
    p = cli("add", env.net_name, env.ns.path, *common, "--args", "K8S_POD_NAME")
    assert p.returncode == EXIT_USAGE
    assert last_json(p.stderr)["code"] == 4

    # a plugin error: the plugin's code and message, exit 4
    p = cli("status", env.net_name, *common)
    assert p.returncode == EXIT_PLUGIN, p.stderr
    err = last_json(p.stderr)
    assert err["code"] == 999 and "nct-no-ipam" in err["msg"], err
    assert set(err) <= {"cniVersion", "code", "msg", "details"}

    # the failed ADD of that list leaves nothing cached (bridge 1.9.1 leaves its veth in the
    # netns and cannot DEL without its IPAM plugin either: the janitor removes the netns)
    p = cli("add", env.net_name, env.ns.path, *common)
    assert p.returncode == EXIT_PLUGIN and last_json(p.stderr)["code"] == 999
    assert env.cache_files() == []

    # a DEL that finds no cache entry warns before the error object, which stays the last line
    p = cli("del", env.net_name, env.ns.path, *common)
    assert p.returncode == EXIT_PLUGIN
    assert p.stderr.splitlines()[0].startswith("nri-cni: warning: ")
    assert "nct-no-ipam" in last_json(p.stderr)["msg"]
    p = cli("del", env.net_name, env.ns.path, *common, "--quiet")
    assert len(p.stderr.splitlines()) == 1 and last_json(p.stderr)["code"] == 999


def test_cli_version_and_gc(cni_env: CniEnv):
    env = cni_env
    p = cli("version", "bridge", "--bin-dir", env.bin_dir)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert "1.1.0" in info["supportedVersions"]

    bridge = unique_name("br")
    env.jan.track_link(bridge)
    src = env.tmp / "n.conflist"
    src.write_text(
        json.dumps(
            env.conflist({"type": "bridge", "bridge": bridge, "ipMasq": False, "ipam": env.host_local()})
        )
    )
    common = ["--conflist", str(src), "--bin-dir", env.bin_dir, "--cache-dir", str(env.cache_dir)]
    other = env.new_netns()
    leaks = env.leak_checker(bridges=[bridge], netns=[env.ns, other]).start()
    assert cli("add", env.net_name, env.ns.path, *common, "--container-id", "nct-keep").returncode == 0
    assert cli("add", env.net_name, other.path, *common, "--container-id", "nct-drop").returncode == 0
    leaks.learn()
    p = cli("gc", env.net_name, *common, "--valid", "nct-keep/eth0")
    assert p.returncode == 0, p.stderr
    assert [r.container_id for r in host_local_reservations(env.data_dir)] == ["nct-keep"]
    assert [li.name for li in other.links()] == ["lo"]
    p = cli("gc", env.net_name, *common, "--valid", "no-slash")
    assert p.returncode != 0 and last_json(p.stderr)["code"] == 4
    p = cli("gc", env.net_name, *common)  # no valid set: everything goes (as cnitool gc)
    assert p.returncode == 0, p.stderr
    leaks.assert_clean()
