"""A local node to try nri-cni on: containerd (from .ci/install-deps) with NRI on, nri-cni in shim
mode on its embedded default config, and a CRI client to start pods.

    python3 config/local/node.py up          # start containerd and nri-cni (background)
    python3 config/local/node.py up --runtime crio   # the same with CRI-O instead of containerd
    python3 config/local/node.py status      # is each running, and is nri-cni ready
    python3 config/local/node.py pod NAME    # start a pod through CRI, print its IP
    python3 config/local/node.py rm NAME     # stop and remove that pod
    python3 config/local/node.py down        # remove every pod, stop both, clean up

The containerd config is composed from config/containerd/nri.toml and cri.toml (the fragments a
node admin merges) with containerd's own dirs under /var/lib/nri-cni-local and its sockets in
/run/nri-cni-local; NRI listens on the default /var/run/nri/nri.sock, CNI uses /etc/cni/net.d and
/opt/cni/bin, exactly where the embedded default config expects them. No registry is reachable
here, so the pause image is built locally (tests/support/pause) and imported.

With `--runtime crio`: CRI-O (unpacked by .ci/install-deps from $NRI_CNI_CRIO_DIR, default
../shared/crio) with the shipped config/crio/crio.conf.d/10-nri-cni.conf as it is, its own dirs
under /run/nri-cni-local/crio (vfs storage, netns pins) and its socket in /run/nri-cni-local;
the shim list is config/crio/net.d/10-nri-cni.conflist. The other commands act on the runtime
`up` started (named in /run/nri-cni-local/runtime).

Run with the system's python3 it re-runs itself with the virtualenv `config/local/up.sh` made
(.venv), which has grpc and the rest. A failure is one line that says what to do, never a
traceback: after a crash of nri-cni, `pod` says so and where its log is.
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
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def _in_venv_if_needed() -> None:
    """The system's python3 has no grpc (PEP 668 keeps pip out of it): use the project's venv."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parents[1].resolve():
            os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
        sys.exit(f"node.py: no virtualenv at {VENV_PYTHON}: run `bash config/local/up.sh` first")


if __name__ == "__main__":
    _in_venv_if_needed()
sys.path.insert(0, str(REPO))

from tests.support import crio as crio_support  # noqa: E402
from tests.support import toml_write  # noqa: E402
from tests.support.containerd import (  # noqa: E402
    CRI_IMG,
    CRI_RT,
    NRI,
    bin_dir,
    cgroup_dirs,
    cni_plugin_dir,
    load_fragments,
    remove_cgroup_trees,
    umount_under,
)
from tests.support.cri import CriClient  # noqa: E402
from tests.support.pause.image import build_pause_image  # noqa: E402

STATE = Path("/var/lib/nri-cni-local")
RUN = Path("/run/nri-cni-local")
ADDRESS = RUN / "containerd.sock"
CONF_DIR = Path("/etc/cni/net.d")
BIN_DIR = Path("/opt/cni/bin")
SHIM_LIST = REPO / "config" / "containerd" / "net.d" / "10-nri-cni.conflist"
CRIO_SHIM_LIST = REPO / "config" / "crio" / "net.d" / "10-nri-cni.conflist"
CGROUP_PARENT = "/nri-cni-local"
NAMESPACE = "demo"
STARTED = float(os.environ.get("NRI_CNI_UP_START") or time.time())  # up.sh's clock, if it started us


class NodeError(Exception):
    """What went wrong, in one line for the person at the terminal."""


_command = "up"  # the prefix of progress lines: the command that prints them


def say(message: str) -> None:
    print(f"{_command}: [{int(time.time()) - int(STARTED):3d}s] {message}", flush=True)  # as up.sh counts


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def pid_of(name: str) -> int | None:
    """The pid in RUN/<name>.pid if that process is alive and is the one we started: a daemon
    killed a moment ago may linger as a zombie, and its pid may be reused by anything."""
    try:
        pid = int((RUN / f"{name}.pid").read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    state = stat.rpartition(")")[2].split()[0]
    marker = "nri_cni.cli run" if name == "nri-cni" else name
    return pid if state not in ("Z", "X") and marker in cmdline else None


def start_background(name: str, argv: list[str], env: dict | None = None) -> int:
    log = open(STATE / f"{name}.log", "ab")
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env
    )
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def runtime() -> str:
    try:
        return (RUN / "runtime").read_text().strip() or "containerd"  # which one `up` started
    except OSError:
        return "containerd"


def install_cni(shim_list: Path = SHIM_LIST) -> None:
    """The real plugins, the shim, and the shim list as the runtime's only network."""
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    for plugin in cni_plugin_dir().iterdir():
        target = BIN_DIR / plugin.name
        if not target.exists():
            target.symlink_to(plugin)
    sh(sys.executable, "-m", "nri_cni.cli", "install-shim", str(BIN_DIR), stdout=subprocess.DEVNULL)
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shim_list, CONF_DIR / shim_list.name)


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
    if runtime() == "crio":
        return crio_support.CrioCriClient(str(RUN / "crio.sock"), cgroup_parent=CGROUP_PARENT)
    return CriClient(str(ADDRESS), cgroup_parent=CGROUP_PARENT)


def nri_cni(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nri_cni.cli", *args], capture_output=True, text=True)


def up(runtime_name: str = "containerd") -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    running = runtime()
    if running != runtime_name and pid_of(running):
        raise NodeError(f"the local node runs {running}: `python3 config/local/node.py down` first")
    (RUN / "runtime").write_text(runtime_name)
    if runtime_name == "crio":
        return up_crio()
    say(f"installing the CNI plugins and nri-cni-shim into {BIN_DIR}, the shim list into {CONF_DIR}")
    install_cni()
    say("building the pause image (no registry here)")
    pause = build_pause_image()
    if not pid_of("containerd"):
        say("starting containerd (NRI on)")
        env = dict(os.environ, PATH=f"{bin_dir()}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        start_background(
            "containerd", [str(bin_dir() / "containerd"), "--config", str(containerd_config(pause.ref))], env
        )
        say(f"waiting for containerd's socket {ADDRESS}")
        for _ in range(200):
            if ADDRESS.exists():
                break
            time.sleep(0.05)
        else:
            raise NodeError(f"containerd did not start; see {STATE / 'containerd.log'}")
        say("importing the pause image")
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
    say(f"containerd: running (pid {pid_of('containerd')}, log {STATE / 'containerd.log'})")
    start_nri_cni()
    print(f"try:  python3 config/local/node.py pod demo-1 && {REPO / '.venv/bin/nri-cni'} pods")
    return 0


def crio_instance() -> crio_support.Crio:
    """The local node's CRI-O: the shipped drop-in, its dirs under RUN/crio, NRI and CNI where
    nri-cni's embedded default config expects them."""
    if not crio_support.available():
        raise NodeError(
            f"no CRI-O in {crio_support.bin_dir()} (or no conmon): put it at ../shared/crio or set "
            "NRI_CNI_CRIO_DIR, then run `bash config/local/up.sh --runtime crio` again"
        )
    inst = crio_support.Crio(
        RUN / "crio",  # not under /var/lib: copyimg runs with a tmpfs over it
        cni_conf_dir=CONF_DIR,
        cni_bin_dirs=[BIN_DIR],
        pause=build_pause_image(),
        sock_dir=RUN,
        nri_socket="/var/run/nri/nri.sock",
        cgroup_parent=CGROUP_PARENT,
    )
    inst.keep_at_exit()
    return inst


def up_crio() -> int:
    say(f"installing the CNI plugins and nri-cni-shim into {BIN_DIR}, the shim list into {CONF_DIR}")
    install_cni(CRIO_SHIM_LIST)
    if not pid_of("crio"):
        inst = crio_instance()
        inst.write_config()
        say("importing the pause image into CRI-O's storage (built here: no registry)")
        inst.import_pause()
        say("starting CRI-O (NRI on, config/crio/crio.conf.d/10-nri-cni.conf as shipped)")
        start_background("crio", inst.crio_argv(), inst.env())
        say(f"waiting for CRI-O's socket {RUN / 'crio.sock'}")
        for _ in range(300):
            if not pid_of("crio"):
                raise NodeError(f"CRI-O exited at start; see {STATE / 'crio.log'}")
            try:
                cri().version(timeout=1.0)
                break
            except Exception:  # grpc.RpcError until it listens
                time.sleep(0.1)
        else:
            raise NodeError(f"CRI-O did not start; see {STATE / 'crio.log'}")
    say(f"crio:       running (pid {pid_of('crio')}, log {STATE / 'crio.log'})")
    start_nri_cni()
    print(f"try:  python3 config/local/node.py pod demo-1 && {REPO / '.venv/bin/nri-cni'} pods")
    return 0


def start_nri_cni() -> None:
    if not pid_of("nri-cni"):
        say("starting nri-cni (shim mode, embedded default config)")
        start_background("nri-cni", [sys.executable, "-m", "nri_cni.cli", "run"])
    say(f"waiting for nri-cni to register with {runtime()} and report ready")
    for _ in range(200):
        if nri_cni("status").returncode == 0:
            break
        if not pid_of("nri-cni"):
            raise NodeError(f"nri-cni exited at start; see {STATE / 'nri-cni.log'}")
        time.sleep(0.1)
    else:
        raise NodeError(f"nri-cni did not become ready; see {STATE / 'nri-cni.log'}")
    say(f"nri-cni:    ready (pid {pid_of('nri-cni')}, log {STATE / 'nri-cni.log'})")


def require_running() -> None:
    """Pod commands need both; after a crash, say which one is gone and where its log is."""
    if not pid_of(runtime()):
        raise NodeError("the local node is not up: run `bash config/local/up.sh`")
    if not pid_of("nri-cni"):
        log = STATE / "nri-cni.log"
        last = _last_line(log)
        raise NodeError(
            f"nri-cni is not running (it exited{': ' + last if last else ''}); see {log}, "
            "then start it again with `python3 config/local/node.py up`"
        )


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip()[:200] if lines else ""


def status() -> int:
    for name in (runtime(), "nri-cni"):
        pid = pid_of(name)
        print(
            f"{name + ':':12}{f'running (pid {pid})' if pid else 'not running'}, log {STATE / (name + '.log')}"
        )
    if not pid_of("nri-cni"):
        return 2
    result = nri_cni("status")
    print(result.stdout, end="")
    print(result.stderr, end="", file=sys.stderr)
    return result.returncode


def pod(name: str) -> int:
    require_running()
    client = cri()
    pod_id = client.run_pod(name, NAMESPACE, str(uuid.uuid4()))
    st = client.pod_status(pod_id)
    print(json.dumps({"pod": f"{NAMESPACE}/{name}", "id": pod_id, "ip": st.ip}))
    return 0


def rm(name: str) -> int:
    require_running()
    client = cri()
    for p in client.list_pods():
        if p.name == name:
            client.stop_pod(p.id)
            client.remove_pod(p.id)
    return 0


def down() -> int:
    rt = runtime()
    if pid_of(rt):
        if not pid_of("nri-cni"):  # crashed: the pods' DELs need it (IPAM leases, links)
            start_nri_cni()
        client = cri()
        for p in client.list_pods():
            client.stop_pod(p.id)
            client.remove_pod(p.id)
    for name in ("nri-cni", rt):
        pid = pid_of(name)
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not pid_of(name):
                    break
                time.sleep(0.1)
        (RUN / f"{name}.pid").unlink(missing_ok=True)
    if rt == "crio":
        # its netns pins (CRI-O removes a pod's at its stop; a crash leaves them) and the pods'
        # cgroups, which CRI-O leaves behind
        problems: list[str] = []
        umount_under((RUN / "crio",), problems)
        problems += remove_cgroup_trees(cgroup_dirs(CGROUP_PARENT))
        Path("/var/run/nri/nri.sock").unlink(missing_ok=True)  # CRI-O leaves its NRI socket
        for problem in problems:
            say(problem)
    else:
        # containerd's shims outlive it by design; stop the ones of this node
        subprocess.run(["pkill", "-f", f"containerd-shim-runc-v2 .*-address {ADDRESS}"], check=False)
        subprocess.run(["umount", "-R", str(RUN / "state")], capture_output=True, check=False)
    shutil.rmtree(RUN, ignore_errors=True)
    subprocess.run(["ip", "link", "del", "nricni0"], capture_output=True, check=False)
    # what up installed: the shim's list (a real containerd would take it) and the binaries
    (CONF_DIR / SHIM_LIST.name).unlink(missing_ok=True)
    (BIN_DIR / "nri-cni-shim").unlink(missing_ok=True)
    plugins = cni_plugin_dir()
    for link in BIN_DIR.glob("*") if BIN_DIR.is_dir() else ():
        if link.is_symlink() and Path(os.readlink(link)).parent == plugins:
            link.unlink()
    print("local node stopped")
    return 0


COMMANDS = {
    "up": up,
    "up-containerd": up,
    "up-crio": lambda: up("crio"),
    "status": status,
    "down": down,
}
POD_COMMANDS = {"pod": pod, "rm": rm}


def main(argv: list[str]) -> int:
    global _command
    if not argv or argv[0] not in (*COMMANDS, *POD_COMMANDS):
        print(__doc__, file=sys.stderr)
        return 2
    _command = argv[0]
    if argv[0] == "up" and len(argv) > 1:
        if argv[1:] not in (["--runtime", "containerd"], ["--runtime", "crio"]):
            print("usage: node.py up [--runtime containerd|crio]", file=sys.stderr)
            return 2
        argv = ["up-" + argv[2]]
    try:
        if argv[0] in POD_COMMANDS:
            if len(argv) != 2:
                print(f"usage: node.py {argv[0]} NAME", file=sys.stderr)
                return 2
            return POD_COMMANDS[argv[0]](argv[1])
        return COMMANDS[argv[0]]()
    except NodeError as exc:
        print(f"node.py {argv[0]}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # grpc.RpcError, OSError, a failed command: one line, not a traceback
        print(f"node.py {argv[0]}: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)  # a grpc error's own message
    return " ".join(str(text or type(exc).__name__).split())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
