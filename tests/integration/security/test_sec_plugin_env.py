"""What a plugin inherits: nri-cni runs as a real process, pre-registered (the NRI
test double starts it with the runtime's connection on fd 3, as containerd does), from a
directory of its own, with a secret in its environment and one more inheritable descriptor.
The plugin it runs sees only PATH, the CNI variables and what `cni.plugin_env` names, no
descriptor besides its stdio, and "/" as its working directory."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from tests.support.bin_dir import install_plugin, python_script
from tests.support.conflists import conflist, network
from tests.support.harness import new_pod_id, pod_message, run
from tests.support.nri_runtime import NriRuntime

pytestmark = pytest.mark.netns

DUMP_PLUGIN = r"""
import json, os, sys
conf = json.loads(sys.stdin.read() or "{}")
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass
if os.environ.get("CNI_COMMAND") == "ADD":
    with open(conf["dump"], "a") as f:
        f.write(json.dumps({"env": dict(os.environ), "fds": fds, "cwd": os.getcwd()}) + "\n")
    print(json.dumps({"cniVersion": conf.get("cniVersion")}))
elif os.environ.get("CNI_COMMAND") == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}))
"""


def test_plugins_get_a_minimal_environment_no_inherited_descriptors_and_a_fixed_cwd(node, tmp_path):
    ns = node.jan.netns()
    install_plugin(node.bin_dir, "dump-env", python_script(DUMP_PLUGIN))
    dump = tmp_path / "dump.jsonl"
    nets = [network(conflist("podnet", {"type": "dump-env", "dump": str(dump)}))]
    cfg = node.config("native", nets, cni={**node.config("native", nets)["cni"], "plugin_env": ["WANTED"]})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    workdir = tmp_path / "started-here"
    workdir.mkdir()
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_r, True)

    async def scenario():
        runtime = NriRuntime(None, request_timeout_ms=20000)
        try:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "SECRET_TOKEN": "do-not-leak",
                "WANTED": "yes",
                "PYTHONPATH": os.pathsep.join(sys.path),
            }
            await runtime.launch(
                [sys.executable, "-m", "nri_cni.cli", "run", "--config", str(config_path)],
                name="cni",
                idx="10",
                env=env,
                cwd=str(workdir),
            )
            await runtime.wait_plugin(timeout=20)
            pod = pod_message(new_pod_id(), ns.path)
            await runtime.run_pod_sandbox(pod)
            await runtime.stop_pod_sandbox(pod)
        finally:
            await runtime.stop()

    try:
        run(scenario())
    finally:
        os.close(leaked_r)
        os.close(leaked_w)
    calls = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(calls) == 1
    seen = calls[0]
    assert "SECRET_TOKEN" not in seen["env"] and "PYTHONPATH" not in seen["env"]
    assert seen["env"]["WANTED"] == "yes"
    assert {k for k in seen["env"] if not k.startswith("CNI_")} <= {"PATH", "WANTED", "LC_CTYPE"}
    extra = {fd: target for fd, target in seen["fds"].items() if int(fd) > 2}
    # only the descriptor listing /proc/self/fd itself
    assert all(target.startswith("/proc/") for target in extra.values()), extra
    assert seen["cwd"] == "/"


def test_a_reload_cannot_change_what_plugins_get_without_a_restart():
    from nri_cni.daemon.reload import RESTART_ONLY

    assert "cni.plugin_env" in {key for key, _ in RESTART_ONLY}


def test_plugin_env_names_are_checked():
    from nri_cni.config import parse_config
    from nri_cni.errors import ConfigError

    for bad in (["CNI_COMMAND"], ["A=B"], ["1X"]):
        with pytest.raises(ConfigError):
            parse_config({"cni": {"plugin_env": bad}}, "/x/config.yaml")
    assert parse_config({"cni": {"plugin_env": ["HTTP_PROXY"]}}, "/x/c.yaml").cni.plugin_env == (
        "HTTP_PROXY",
    )
