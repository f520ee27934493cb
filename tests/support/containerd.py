"""A private, real containerd for the end-to-end tests.

The instance runs from ``$NRI_CNI_DEPS/root/usr/bin`` (default /opt/nri-cni-deps) with its
root, state, sockets, runc root and NRI dirs under a temp dir, and a config built from the
fragments shipped in ``config/containerd/`` (only paths, the sandbox image and, on request,
the NRI request timeout are changed). Some things containerd puts outside its dirs cannot
be redirected: netns mounts (/var/run/netns/cni-*), libcni's cache (/var/lib/cni/results),
shim sockets (/run/containerd/s), and pod cgroups. ``cleanup()`` removes those for the pods
of this instance.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support import toml_write
from tests.support.cri import CriClient, compile_cri, deps_prefix
from tests.support.pause.image import PauseImage, build_pause_image
from tests.support.runtime_proc import RuntimeProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "config" / "containerd"
FRAGMENTS = ("nri.toml", "cri.toml")
K8S_NS = "k8s.io"
SHIM_SOCKET_DIR = Path("/run/containerd/s")
CNI_RESULTS_DIR = Path("/var/lib/cni/results")
NETNS_DIR = Path("/var/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SUN_PATH_MAX = 107  # sockaddr_un.sun_path minus the NUL

NRI = "io.containerd.nri.v1.nri"
CRI_RT = "io.containerd.cri.v1.runtime"
CRI_IMG = "io.containerd.cri.v1.images"

_live: weakref.WeakSet[Containerd] = weakref.WeakSet()
_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def bin_dir() -> Path:
    return deps_prefix() / "root" / "usr" / "bin"


def cni_plugin_dir() -> Path:
    return deps_prefix() / "root" / "usr" / "lib" / "cni"


def load_fragments(config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """The shipped config fragments, merged (later files win)."""
    merged: dict[str, Any] = {}
    for name in FRAGMENTS:
        with open(config_dir / name, "rb") as f:
            merged = toml_write.deep_merge(merged, tomllib.load(f))
    return merged


def _duration(value: str | float | int) -> str:
    if isinstance(value, str):
        return value
    return f"{int(round(value * 1000))}ms"


def umount(path: str | os.PathLike[str], *, lazy_fallback: bool = True) -> None:
    p = os.fsencode(os.fspath(path))
    if _libc.umount2(p, 0) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
        return
    if lazy_fallback and _libc.umount2(p, MNT_DETACH) == 0:
        return
    raise OSError(err, os.strerror(err), os.fspath(path))


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix``, deepest first."""
    pre = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == pre or mp.startswith(pre + "/"):
                found.append(mp)
    return sorted(set(found), key=lambda m: (-m.count("/"), m))


def umount_under(bases: Iterable[Path | None], problems: list[str]) -> None:
    """Unmount everything at or below each base (deepest first); failures go to `problems`."""
    for base in bases:
        if base is None:
            continue
        for mp in mounts_under(base):
            try:
                umount(mp)
            except OSError as exc:
                problems.append(f"umount {mp}: {exc}")


def remove_netns(path: str | os.PathLike[str]) -> None:
    umount(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _orphan_netns(before: set[str]) -> list[Path]:
    """containerd's netns (cni-*) that appeared since `before` and that no process is in: a
    running pod's pause process is in its netns; a leaked one has nobody."""
    in_use = set()
    for pid in _listdir(Path("/proc")):
        if pid.isdigit():
            try:
                in_use.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
            except OSError:
                pass  # gone meanwhile
    orphans = []
    for name in _listdir(NETNS_DIR):
        if name.startswith("cni-") and name not in before:
            try:
                if os.stat(NETNS_DIR / name).st_ino not in in_use:
                    orphans.append(NETNS_DIR / name)
            except OSError:
                pass
    return orphans


def cgroup_dirs(parent: str) -> list[Path]:
    """The cgroup `parent` in every mounted hierarchy (v1 and v2) where it exists."""
    rel = parent.lstrip("/")
    candidates = [CGROUP_ROOT / rel]
    try:
        candidates += [h / rel for h in CGROUP_ROOT.iterdir() if h.is_dir()]
    except FileNotFoundError:
        pass
    return [c for c in candidates if c.is_dir()]


def kill_cgroup_procs(tops: list[Path]) -> None:
    """SIGKILL every process in the cgroup trees under `tops` (thawed first)."""
    for top in tops:
        for dirpath, _dirs, files in os.walk(top):
            # runc freezes a container while it sets it up; a runtime killed meanwhile
            # leaves `runc init` frozen, where SIGKILL waits until the cgroup is thawed
            for name, thawed in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                if name in files:
                    try:
                        Path(dirpath, name).write_text(thawed)
                    except OSError:
                        pass
            if "cgroup.procs" not in files:
                continue
            try:
                pids = Path(dirpath, "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def remove_cgroup_trees(tops: list[Path]) -> list[str]:
    """rmdir the cgroup trees under `tops`, deepest first; returns the problems."""
    problems = []
    for top in tops:
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
            for _ in range(50):
                try:
                    os.rmdir(dirpath)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        problems.append(f"rmdir {dirpath}: {exc}")
                        break
                    time.sleep(0.02)  # killed processes still exiting
            else:
                problems.append(f"rmdir {dirpath}: busy")
    return problems


class ContainerdError(RuntimeError):
    pass


class Containerd(RuntimeProcess):
    """One containerd process with private dirs. Not running until ``start()``."""

    name = "containerd"
    error = ContainerdError

    def __init__(
        self,
        tmpdir: str | os.PathLike[str],
        *,
        cni_conf_dir: str | os.PathLike[str],
        cni_bin_dirs: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
        nri_plugin_path: str | os.PathLike[str] | None = None,
        nri_plugin_config_path: str | os.PathLike[str] | None = None,
        nri_request_timeout: str | float | None = None,
        max_conf_num: int = 1,
        extra: Mapping[str, Any] | None = None,
        pause: PauseImage | None = None,
        log_level: str = "info",
        start_timeout: float = 60.0,
    ) -> None:
        self.tmpdir = Path(tmpdir).resolve()
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.tag = secrets.token_hex(4)
        self.root = self.tmpdir / "root"
        self.state = self.tmpdir / "state"
        self.runc_root = self.tmpdir / "runc"
        self.opt_dir = self.tmpdir / "opt"
        self.temp_dir = self.tmpdir / "tmp"
        self.log_path = self.tmpdir / "containerd.log"
        self.config_path = self.tmpdir / "config.toml"
        # Unix socket paths are limited to 107 bytes; fall back to a short private dir.
        self._own_sock_dir: Path | None = None
        sock_dir = self.tmpdir
        if len(str(sock_dir / "containerd.sock.ttrpc")) > SUN_PATH_MAX - 20:
            self._own_sock_dir = Path(tempfile.mkdtemp(prefix=f"nct-{self.tag}-"))
            sock_dir = self._own_sock_dir
        self.address = str(sock_dir / "containerd.sock")
        self.nri_socket = str(sock_dir / "nri.sock")
        self.cni_conf_dir = Path(cni_conf_dir)
        self.cni_bin_dirs = [str(d) for d in cni_bin_dirs]
        self.nri_plugin_path = Path(nri_plugin_path or self.tmpdir / "nri-plugins")
        self.nri_plugin_config_path = Path(nri_plugin_config_path or self.tmpdir / "nri-conf.d")
        self.nri_request_timeout = nri_request_timeout
        self.max_conf_num = max_conf_num
        self.extra = dict(extra or {})
        self.pause = pause or build_pause_image()
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.cgroup_parent = f"/nct-{self.tag}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._cri: CriClient | None = None
        self._image_imported = False
        self._known_pods: set[str] = set()
        self._known_netns: set[str] = set()
        # the runtime's netns dir as it was before this instance: what appears later and no
        # process lives in is this instance's garbage (see _orphan_netns)
        self._netns_before = set(_listdir(NETNS_DIR))
        self.start_seconds: float | None = None  # wall time of the last start() (to CRI ready)
        compile_cri()
        _live.add(self)

    # -- config --------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        cfg = load_fragments()
        nri: dict[str, Any] = {
            "socket_path": self.nri_socket,
            "plugin_path": str(self.nri_plugin_path),
            "plugin_config_path": str(self.nri_plugin_config_path),
        }
        if self.nri_request_timeout is not None:
            nri["plugin_request_timeout"] = _duration(self.nri_request_timeout)
        overrides: dict[str, Any] = {
            "root": str(self.root),
            "state": str(self.state),
            "temp": str(self.temp_dir),
            "grpc": {"address": self.address},
            "debug": {"level": self.log_level},
            "plugins": {
                NRI: nri,
                CRI_IMG: {"pinned_images": {"sandbox": self.pause.ref}},
                CRI_RT: {
                    "containerd": {"runtimes": {"runc": {"options": {"Root": str(self.runc_root)}}}},
                    "cni": {
                        "conf_dir": str(self.cni_conf_dir),
                        "bin_dirs": self.cni_bin_dirs,
                        "max_conf_num": self.max_conf_num,
                    },
                },
                "io.containerd.internal.v1.opt": {"path": str(self.opt_dir)},
            },
        }
        cfg = toml_write.deep_merge(cfg, overrides)
        return toml_write.deep_merge(cfg, self.extra)

    def write_config(self) -> Path:
        for d in (
            self.root,
            self.state,
            self.runc_root,
            self.temp_dir,
            self.nri_plugin_path,
            self.nri_plugin_config_path,
        ):
            d.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(toml_write.dumps(self.config()))
        return self.config_path

    # -- process -------------------------------------------------------------------------------

    @property
    def cri(self) -> CriClient:
        if self._cri is None:
            self._cri = _RecordingCriClient(self, self.address, cgroup_parent=self.cgroup_parent)
        return self._cri

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{bin_dir()}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def start(self) -> None:
        if self.running:
            raise ContainerdError("already running")
        exe = bin_dir() / "containerd"
        if not os.access(exe, os.X_OK):
            raise ContainerdError(f"{exe} missing: run .ci/install-deps (or set NRI_CNI_DEPS)")
        self.write_config()
        for sock in (self.address, self.address + ".ttrpc", self.nri_socket):
            try:
                os.unlink(sock)
            except FileNotFoundError:
                pass
        t0 = self._spawn([str(exe), "--config", str(self.config_path)], self.env())
        try:
            self._wait_ready(t0)
            self.start_seconds = time.monotonic() - t0
            if not self._image_imported:
                self.import_image(self.pause.archive)
                self._wait_image(self.pause.ref)
                self._image_imported = True
        except BaseException:
            self.stop()
            raise

    def ctr(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        cmd = [str(bin_dir() / "ctr"), "--address", self.address, "-n", K8S_NS, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env())
        if proc.returncode != 0:
            raise ContainerdError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def _wait_image(self, ref: str, timeout: float = 10.0) -> None:
        # CRI learns about ctr's import through an event; wait until it sees the image.
        deadline = time.monotonic() + timeout
        while not self.cri.image_present(ref):
            if time.monotonic() > deadline:
                raise ContainerdError(f"CRI does not see {ref} after import\n{self.log_tail()}")
            time.sleep(0.02)

    # -- cleanup -------------------------------------------------------------------------------

    def _remember_pod(self, pod_id: str, netns: str | None = None) -> None:
        self._known_pods.add(pod_id)
        if netns:
            self._known_netns.add(netns)

    def pod_ids_on_disk(self) -> set[str]:
        ids: set[str] = set()
        for d in (
            self.state / "io.containerd.runtime.v2.task" / K8S_NS,
            self.root / "io.containerd.grpc.v1.cri" / "sandboxes",
            self.state / "io.containerd.grpc.v1.cri" / "sandboxes",
            self.runc_root / K8S_NS,
        ):
            try:
                ids.update(p.name for p in d.iterdir())
            except FileNotFoundError:
                pass
        return ids

    def shim_pids(self) -> list[int]:
        """containerd-shim-runc-v2 processes started by this instance."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"containerd-shim-runc-v2"):
                continue
            if b"-address" in argv:
                i = argv.index(b"-address")
                if i + 1 < len(argv) and argv[i + 1] == self.address.encode():
                    pids.append(int(entry))
        return pids

    def shim_socket(self, pod_id: str) -> Path:
        digest = hashlib.sha256(os.path.join(self.address, K8S_NS, pod_id).encode()).hexdigest()
        return SHIM_SOCKET_DIR / digest

    def cgroup_dirs(self) -> list[Path]:
        """This instance's pod cgroup parent in every mounted hierarchy (v1 and v2)."""
        return cgroup_dirs(self.cgroup_parent)

    def _kill_cgroup_procs(self) -> None:
        kill_cgroup_procs(self.cgroup_dirs())

    def _remove_cgroups(self) -> list[str]:
        return remove_cgroup_trees(self.cgroup_dirs())

    def cleanup(self) -> list[str]:
        """Remove every pod, stop containerd, then remove what containerd left outside
        the temp dir. Returns a list of problems (empty when all went well)."""
        problems: list[str] = []
        pods: set[str] = set(self._known_pods) | self.remove_listed_pods(problems)
        pods |= self.pod_ids_on_disk()
        try:
            self.stop()
        except Exception as exc:
            problems.append(f"stop: {exc}")
        _live.discard(self)

        # processes: shims of this instance, then anything left in its pod cgroups
        for pid in self.shim_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._kill_cgroup_procs()

        # libcni cache entries of its pods (and the netns they name)
        for pod_id in pods:
            for entry in CNI_RESULTS_DIR.glob(f"*-{pod_id}-*"):
                try:
                    netns = json.loads(entry.read_text()).get("netns")
                    if netns:
                        self._known_netns.add(netns)
                except (OSError, ValueError):
                    pass
                entry.unlink(missing_ok=True)
            for sock in (self.shim_socket(pod_id), Path(str(self.shim_socket(pod_id)) + ".debug")):
                sock.unlink(missing_ok=True)
        # A pod creation cut by a restart leaves a netns the next containerd never knew of
        # (the sandbox was not yet stored): nobody lives in it and nobody removes it. Nor the
        # CNI cache entries containerd wrote for it.
        orphans = {str(p) for p in _orphan_netns(self._netns_before)}
        self._known_netns.update(orphans)
        for entry in CNI_RESULTS_DIR.glob("*") if orphans else ():
            try:
                if json.loads(entry.read_text()).get("netns") in orphans:
                    entry.unlink(missing_ok=True)
            except (OSError, ValueError):
                pass
        for netns in self._known_netns:
            if Path(netns).parent in (NETNS_DIR, Path("/run/netns")) or Path(netns).is_relative_to(
                self.tmpdir
            ):
                try:
                    remove_netns(netns)
                except OSError as exc:
                    problems.append(f"netns {netns}: {exc}")
        problems += self._remove_cgroups()

        # mounts under the temp dir (rootfs overlays, shm), then containerd's own dirs
        umount_under((self.tmpdir, self._own_sock_dir), problems)
        for d in (self.root, self.state, self.runc_root, self.opt_dir, self.temp_dir):
            shutil.rmtree(d, ignore_errors=True)
            if d.exists():
                problems.append(f"could not remove {d}")
        if self._own_sock_dir is not None:
            shutil.rmtree(self._own_sock_dir, ignore_errors=True)
        return problems


class _RecordingCriClient(CriClient):
    """The instance's client: remembers every pod it created (and its netns) for cleanup."""

    def __init__(self, owner: Containerd, address: str, **kw: Any) -> None:
        super().__init__(address, **kw)
        self._owner = weakref.ref(owner)

    def run_pod(self, *args: Any, **kwargs: Any) -> str:
        pod_id = super().run_pod(*args, **kwargs)
        owner = self._owner()
        if owner is not None:
            owner._remember_pod(pod_id)
        return pod_id

    def pod_status(self, pod_id: str, **kwargs: Any) -> Any:
        st = super().pod_status(pod_id, **kwargs)
        owner = self._owner()
        if owner is not None:
            owner._remember_pod(pod_id, st.netns_path)
        return st


@atexit.register
def _cleanup_leftovers() -> None:
    """Never leave a containerd running, even when a test run is interrupted."""
    for inst in list(_live):
        try:
            inst.cleanup()
        except Exception:
            pass
