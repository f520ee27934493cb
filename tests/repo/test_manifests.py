"""The deployment files: the shim's CNI list, the CRI-O drop-in, the DaemonSet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from nri_cni.cni.config import parse_conflist
from nri_cni.config import (
    DEFAULT_BIN_DIRS,
    DEFAULT_CACHE_DIR,
    DEFAULT_CONFIG_PATH,
    DEFAULT_DAEMON_SOCKET,
    DEFAULT_FINALIZE_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_RUNTIME_CACHE_DIR,
    DEFAULT_STATE_DIR,
    load_config,
)
from nri_cni.daemon.local_server import POD_ANNOTATIONS_CAP
from nri_cni.errors import ConfigError
from nri_cni.shim import SHIM_NAME

ROOT = Path(__file__).resolve().parents[2]
SHIM_LIST = ROOT / "config" / "containerd" / "net.d" / "10-nri-cni.conflist"
CRIO_LIST = ROOT / "config" / "crio" / "net.d" / "10-nri-cni.conflist"
CRIO_CONF = ROOT / "config" / "crio" / "crio.conf.d" / "10-nri-cni.conf"
CONTAINERD_NRI = ROOT / "config" / "containerd" / "nri.toml"
DAEMONSET = ROOT / "config" / "kubernetes" / "nri-cni.yaml"
CONF_DIR = os.path.dirname(DEFAULT_FINALIZE_DIR)  # /etc/cni/net.d


def norm(path: str) -> str:
    return os.path.normpath(path)


def go_duration(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert m, f"not a duration: {text!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# -- the shim's network list --------------------------------------------------------------


def test_shim_list_names_the_shim():
    net = parse_conflist(SHIM_LIST.read_bytes(), source=str(SHIM_LIST))
    assert net.name == "nri-cni"
    assert [p.type for p in net.plugins] == [SHIM_NAME]
    assert net.raw["cniVersion"] == "1.0.0"
    assert net.cni_version == "1.1.0"  # from cniVersions, for STATUS and GC
    shim = net.plugins[0]
    assert shim.conf["daemonSocket"] == DEFAULT_DAEMON_SOCKET
    assert shim.capabilities == {
        "portMappings": True,
        "bandwidth": True,
        "dns": True,
        POD_ANNOTATIONS_CAP: True,
    }


def test_crio_uses_the_same_list():
    assert CRIO_LIST.read_bytes() == SHIM_LIST.read_bytes()


# -- CRI-O ----------------------------------------------------------------------------------


def test_crio_dropin():
    conf = tomllib.loads(CRIO_CONF.read_text())
    assert set(conf) == {"crio"}
    net, nri = conf["crio"]["network"], conf["crio"]["nri"]
    assert net["cni_default_network"] == json.loads(SHIM_LIST.read_text())["name"]
    assert norm(net["network_dir"]) == CONF_DIR
    assert {norm(d) for d in net["plugin_dirs"]} >= set(DEFAULT_BIN_DIRS)
    assert nri["enable_nri"] is True
    assert nri["nri_listen"] == DEFAULT_NRI_SOCKET
    assert set(nri) == {
        "enable_nri",
        "nri_listen",
        "nri_plugin_dir",
        "nri_plugin_config_dir",
        "nri_plugin_registration_timeout",
        "nri_plugin_request_timeout",
    }
    # Sized for CNI chains: above the 2 s default, far below kubelet's 4 min deadline.
    request = go_duration(nri["nri_plugin_request_timeout"])
    assert 2 < request <= 60
    assert go_duration(nri["nri_plugin_registration_timeout"]) >= 5


def test_crio_and_containerd_agree():
    crio = tomllib.loads(CRIO_CONF.read_text())["crio"]["nri"]
    ctrd = tomllib.loads(CONTAINERD_NRI.read_text())["plugins"]["io.containerd.nri.v1.nri"]
    assert crio["nri_listen"] == ctrd["socket_path"]
    assert crio["nri_plugin_dir"] == ctrd["plugin_path"]
    assert crio["nri_plugin_config_dir"] == ctrd["plugin_config_path"]
    assert go_duration(crio["nri_plugin_request_timeout"]) == go_duration(ctrd["plugin_request_timeout"])


# -- the DaemonSet ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    out = {}
    for doc in yaml.safe_load_all(DAEMONSET.read_text()):
        if doc:
            out[doc["kind"]] = doc
    return out


def pod_spec(docs) -> dict:
    return docs["DaemonSet"]["spec"]["template"]["spec"]


def host_volumes(docs) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(docs)["volumes"] if "hostPath" in v}


def test_daemonset_shape(docs):
    assert set(docs) == {"ConfigMap", "DaemonSet"}
    for doc in docs.values():
        assert doc["metadata"]["namespace"] == "kube-system"
    ds = docs["DaemonSet"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = pod_spec(docs)
    assert spec["hostNetwork"] is True
    assert not spec.get("hostPID")
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert len(images) == 1
    (main,) = spec["containers"]
    assert main["securityContext"]["privileged"] is True
    assert main["command"] == ["nri-cni", "run", "--config", DEFAULT_CONFIG_PATH]
    assert main["livenessProbe"]["exec"]["command"] == ["nri-cni", "status", "--ping"]
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_daemonset_mounts_the_default_paths_where_the_host_has_them(docs):
    spec = pod_spec(docs)
    hosts = host_volumes(docs)
    (main,) = spec["containers"]
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    for name, path in hosts.items():
        if name in mounts:
            assert norm(mounts[name]["mountPath"]) == norm(path), name
    mounted = {norm(hosts[n]) for n in mounts if n in hosts}
    needed = {
        os.path.dirname(DEFAULT_NRI_SOCKET),
        os.path.dirname(DEFAULT_DAEMON_SOCKET),
        DEFAULT_STATE_DIR,
        DEFAULT_RUNTIME_CACHE_DIR,
        CONF_DIR,
        "/var/run/netns",
        *DEFAULT_BIN_DIRS,
    }
    assert needed <= mounted
    assert any(DEFAULT_CACHE_DIR.startswith(p + "/") or DEFAULT_CACHE_DIR == p for p in mounted)
    netns = next(m for m in main["volumeMounts"] if m["mountPath"] == "/var/run/netns")
    assert netns["mountPropagation"] == "HostToContainer"
    config = next(m for m in main["volumeMounts"] if m["mountPath"] == os.path.dirname(DEFAULT_CONFIG_PATH))
    volume = next(v for v in spec["volumes"] if v["name"] == config["name"])
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]


def configmap_dir(docs, tmp_path: Path) -> Path:
    """The ConfigMap as the container sees it: one file per key."""
    configmap = tmp_path / "configmap"
    configmap.mkdir(exist_ok=True)
    for key, value in docs["ConfigMap"]["data"].items():
        (configmap / key).write_text(value)
    return configmap


def test_configmap_holds_a_valid_config_with_default_paths(docs, tmp_path, monkeypatch):
    data = docs["ConfigMap"]["data"]
    assert json.loads(data["10-nri-cni.conflist"]) == json.loads(SHIM_LIST.read_text())
    monkeypatch.setenv("NODE_NAME", "node-b")
    monkeypatch.delenv("NRI_CNI_NODE_VALUES", raising=False)
    cfg = load_config(str(configmap_dir(docs, tmp_path) / "config.yaml"))
    assert cfg.mode == "shim"
    assert cfg.nri.socket == DEFAULT_NRI_SOCKET
    assert cfg.daemon_socket == DEFAULT_DAEMON_SOCKET
    assert cfg.state_dir == DEFAULT_STATE_DIR
    assert cfg.cni.cache_dir == DEFAULT_CACHE_DIR
    assert cfg.cni.bin_dirs == DEFAULT_BIN_DIRS
    assert cfg.cni.finalize_dir == DEFAULT_FINALIZE_DIR
    # the pod subnet is the node's own (nodes.yaml), not one subnet for every node
    (bridge,) = [p for p in cfg.network("pods").conflist.plugins if p.type == "bridge"]
    assert bridge.conf["ipam"]["ranges"] == [[{"subnet": "10.244.2.0/24"}]]


def test_a_node_without_its_subnet_is_refused_by_name(docs, tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "node-z")
    monkeypatch.delenv("NRI_CNI_NODE_VALUES", raising=False)
    with pytest.raises(ConfigError) as info:
        load_config(str(configmap_dir(docs, tmp_path) / "config.yaml"))
    assert "no value for ${node.podSubnet} on node 'node-z'" in str(info.value)


def _init_script(docs, host: Path, configmap: Path) -> str:
    (init,) = pod_spec(docs)["initContainers"]
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {"/host/opt/cni/bin", "/host/etc/cni/net.d", os.path.dirname(DEFAULT_CONFIG_PATH)} <= mounts
    script = init["command"][2]
    return script.replace("/host", str(host)).replace("/etc/nri-cni/", f"{configmap}/")


def _run_init(docs, tmp_path: Path, host_python: str, **env_over: str) -> subprocess.CompletedProcess:
    host, configmap = tmp_path / "host", tmp_path / "configmap"
    for d in ("opt/cni/bin", "etc/cni/net.d"):
        (host / d).mkdir(parents=True, exist_ok=True)
    configmap.mkdir()
    for key, value in docs["ConfigMap"]["data"].items():
        (configmap / key).write_text(value)
    (init,) = pod_spec(docs)["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    env["HOST_PYTHON"] = host_python
    env.update(env_over)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    return subprocess.run(
        ["/bin/sh", "-ec", _init_script(docs, host, configmap)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_init_container_installs_a_working_shim_and_the_list(docs, tmp_path):
    """Runs the init container's script with /host and the ConfigMap moved into tmp_path."""
    python = os.path.realpath(sys.executable)
    host = tmp_path / "host"
    (host / python.lstrip("/")).parent.mkdir(parents=True)
    os.symlink(python, host / python.lstrip("/"))
    run = _run_init(docs, tmp_path, python)
    assert run.returncode == 0, run.stderr
    shim = host / "opt/cni/bin" / SHIM_NAME
    assert shim.read_text().splitlines()[0] == f"#!{python} -IS"
    installed = host / "etc/cni/net.d/10-nri-cni.conflist"
    assert json.loads(installed.read_text()) == json.loads(SHIM_LIST.read_text())
    assert [p.name for p in (host / "etc/cni/net.d").iterdir()] == ["10-nri-cni.conflist"]
    # The shim runs: VERSION locally, anything else reaches for the daemon's socket.
    env = {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(shim)], input=installed.read_bytes(), env=env, capture_output=True, timeout=30)
    assert out.returncode == 0 and "1.1.0" in json.loads(out.stdout)["supportedVersions"]
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/x",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "NRI_CNI_SOCKET": str(tmp_path / "nobody.sock"),
    }
    out = subprocess.run([str(shim)], input=installed.read_bytes(), env=env, capture_output=True, timeout=30)
    err = json.loads(out.stdout)
    assert out.returncode == 1 and err["code"] == 11
    assert err["msg"] == f"nri-cni daemon is not reachable at {tmp_path / 'nobody.sock'}"


def test_init_container_copies_the_images_static_shim_and_missing_plugins(docs, tmp_path):
    """The Containerfile's image: a prebuilt shim (no Python needed on the node) and the CNI
    plugins it carries, copied where the node has none of that name."""
    image = tmp_path / "image"
    (image / "cni").mkdir(parents=True)
    shim = image / "nri-cni-shim"
    shim.write_text("#!/bin/sh\necho static shim\n")
    shim.chmod(0o755)
    for name in ("bridge", "macvlan"):
        (image / "cni" / name).write_text(f"image's {name}\n")
    bin_dir = tmp_path / "host/opt/cni/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "bridge").write_text("the node's own bridge\n")
    run = _run_init(
        docs, tmp_path, "/usr/bin/no-such-python", SHIM_PREBUILT=str(shim), CNI_PLUGINS=str(image / "cni")
    )
    assert run.returncode == 0, run.stderr
    assert (bin_dir / SHIM_NAME).read_text() == shim.read_text()
    assert (bin_dir / "bridge").read_text() == "the node's own bridge\n"
    assert (bin_dir / "macvlan").read_text() == "image's macvlan\n"
    assert sorted(p.name for p in bin_dir.iterdir()) == ["bridge", "macvlan", SHIM_NAME]


def test_init_container_refuses_a_node_without_python(docs, tmp_path):
    run = _run_init(docs, tmp_path, "/usr/bin/no-such-python")
    assert run.returncode != 0
    assert "/usr/bin/no-such-python" in run.stderr
    assert not (tmp_path / "host/opt/cni/bin" / SHIM_NAME).exists()


def _probe(command: list[str], tmp_path: Path, exit_code: int, ping_code: int) -> int:
    bindir = tmp_path / f"bin{exit_code}-{ping_code}"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "nri-cni"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--ping*) exit {ping_code};; esac\nexit {exit_code}\n')
    fake.chmod(0o755)
    return subprocess.run(command, env={"PATH": f"{bindir}:/usr/bin:/bin"}, timeout=30).returncode


@pytest.mark.parametrize(
    "status_exit, ping_exit, ready, alive",
    [(0, 0, True, True), (1, 0, True, True), (2, 0, False, True), (2, 2, False, False)],
)
def test_probes(docs, tmp_path, status_exit, ping_exit, ready, alive):
    """Ready when `nri-cni status` says ready or degraded (pods can start); restarted only when
    the daemon does not answer (`status --ping`), never because the runtime or a network is down."""
    (main,) = pod_spec(docs)["containers"]
    assert (_probe(main["readinessProbe"]["exec"]["command"], tmp_path, status_exit, ping_exit) == 0) is ready
    assert (_probe(main["livenessProbe"]["exec"]["command"], tmp_path, status_exit, ping_exit) == 0) is alive


def test_ping_fails_only_when_the_daemon_is_down(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "status", "--ping", "--socket", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "not reachable" in run.stderr


def test_status_fails_when_the_daemon_is_down(tmp_path):
    """What the readiness probe runs, against no daemon: exit 2 (not ready), "not reachable"."""
    run = subprocess.run(
        [sys.executable, "-m", "nri_cni.cli", "status", "--socket", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "not reachable" in run.stderr
