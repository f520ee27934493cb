"""A local node to try nri-cni on: containerd (from .ci/install-deps) with NRI on, nri-cni in shim
mode on its embedded default config, and a CRI client to start pods.

    python3 config/local/node.py up          # start containerd and nri-cni (background)
    python3 config/local/node.py pod NAME    # start a pod through CRI, print its IP
    python3 config/local/node.py rm NAME     # stop and remove that pod
    python3 config/local/node.py down        # remove every pod, stop both, clean up

The containerd config is composed from config/containerd/nri.toml and cri.toml (the fragments a
node admin merges) with containerd's own dirs under /var/lib/nri-cni-local and its sockets in
/run/nri-cni-local; NRI listens on the default /var/run/nri/nri.sock, CNI uses /etc/cni/net.d and
/opt/cni/bin, exactly where the embedded default config expects them. No registry is reachable
here, so the pause image is built locally (tests/support/pause) and imported.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support import toml_write  # noqa: E402
from tests.support.containerd import CRI_IMG, CRI_RT, NRI, bin_dir, cni_plugin_dir, load_fragments  # noqa: E402
from tests.support.cri import CriClient  # noqa: E402
from tests.support.pause.image import build_pause_image  # noqa: E402

STATE = Path("/var/lib/nri-cni-local")
RUN = Path("/run/nri-cni-local")
ADDRESS = RUN / "containerd.sock"
CONF_DIR = Path("/etc/cni/net.d")
BIN_DIR = Path("/opt/cni/bin")
SHIM_LIST = REPO / "config" / "containerd" / "net.d" / "10-nri-cni.conflist"
NAMESPACE = "demo"


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def pid_of(name: str) -> int | None:
    try:
        pid = int((RUN / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_background(name: str, argv: list[str], env: dict | None = None) -> int:
    log = open(STATE / f"{name}.log", "ab")
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env
    )
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def install_cni() -> None:
    """The real plugins, the shim, and the shim list as containerd's only network."""
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    for plugin in cni_plugin_dir().iterdir():
        target = BIN_DIR / plugin.name
        if not target.exists():
            target.symlink_to(plugin)
    sh(sys.executable, "-m", "nri_cni.cli", "install-shim", str(BIN_DIR), stdout=subprocess.DEVNULL)
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHIM_LIST, CONF_DIR / SHIM_LIST.name)


def containerd_config(pause_ref: str) -> Path:
    overrides = {
        "root": str(STATE / "root"),
        "state": str(RUN / "state"),
        "grpc": {"address": str(ADDRESS)},
        "plugins": {
            CRI_IMG: {"pinned_images": {"sandbox": pause_ref}},
            CRI_RT: {"cni": {"conf_dir": str(CONF_DIR), "bin_dirs": [str(BIN_DIR)]}},
            "io.containerd.internal.v1.opt": {"path": str(STATE / "opt")},
        },
    }
    cfg = toml_write.deep_merge(load_fragments(), overrides)
    cfg["plugins"][NRI].setdefault("socket_path", "/var/run/nri/nri.sock")
    path = STATE / "containerd.toml"
    path.write_text(toml_write.dumps(cfg))
    return path


def cri() -> CriClient:
    return CriClient(str(ADDRESS), cgroup_parent="/nri-cni-local")


def up() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    install_cni()
    pause = build_pause_image()
    if not pid_of("containerd"):
        env = dict(os.environ, PATH=f"{bin_dir()}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        start_background(
            "containerd", [str(bin_dir() / "containerd"), "--config", str(containerd_config(pause.ref))], env
        )
        for _ in range(200):
            if ADDRESS.exists():
                break
            time.sleep(0.05)
        sh(
            str(bin_dir() / "ctr"),
            "--address",
            str(ADDRESS),
            "-n",
            "k8s.io",
            "images",
            "import",
            str(pause.archive),
            stdout=subprocess.DEVNULL,
        )
    print(f"containerd: running (pid {pid_of('containerd')}, log {STATE / 'containerd.log'})")
    if not pid_of("nri-cni"):
        start_background("nri-cni", [sys.executable, "-m", "nri_cni.cli", "run"])
    for _ in range(200):
        ok = subprocess.run([sys.executable, "-m", "nri_cni.cli", "status"], capture_output=True)
        if ok.returncode == 0:
            break
        time.sleep(0.1)
    else:
        print(f"nri-cni did not become ready; see {STATE / 'nri-cni.log'}", file=sys.stderr)
        return 1
    print(f"nri-cni:    running (pid {pid_of('nri-cni')}, log {STATE / 'nri-cni.log'})")
    print("try:        python3 config/local/node.py pod demo-1 && nri-cni pods")
    return 0


def pod(name: str) -> int:
    client = cri()
    pod_id = client.run_pod(name, NAMESPACE, str(uuid.uuid4()))
    st = client.pod_status(pod_id)
    print(json.dumps({"pod": f"{NAMESPACE}/{name}", "id": pod_id, "ip": st.ip}))
    return 0


def rm(name: str) -> int:
    client = cri()
    for p in client.list_pods():
        if p.name == name:
            client.stop_pod(p.id)
            client.remove_pod(p.id)
    return 0


def down() -> int:
    if pid_of("containerd"):
        client = cri()
        for p in client.list_pods():
            client.stop_pod(p.id)
            client.remove_pod(p.id)
    for name in ("nri-cni", "containerd"):
        pid = pid_of(name)
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)
        (RUN / f"{name}.pid").unlink(missing_ok=True)
    # containerd's shims outlive it by design; stop the ones of this node
    subprocess.run(["pkill", "-f", f"containerd-shim-runc-v2 .*-address {ADDRESS}"], check=False)
    subprocess.run(["umount", "-R", str(RUN / "state")], capture_output=True, check=False)
    shutil.rmtree(RUN, ignore_errors=True)
    subprocess.run(["ip", "link", "del", "nricni0"], capture_output=True, check=False)
    print("local node stopped")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "pod", "rm", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] in ("pod", "rm"):
        if len(argv) != 2:
            print(f"usage: node.py {argv[0]} NAME", file=sys.stderr)
            return 2
        return {"pod": pod, "rm": rm}[argv[0]](argv[1])
    return {"up": up, "down": down}[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
