"""A private, real CRI-O for the end-to-end tests.

The binaries (crio, pinns, copyimg) come from ``$NRI_CNI_DEPS/crio/bin``, where
.ci/install-deps unpacks them from ``$NRI_CNI_CRIO_DIR`` (default ``../shared/crio``); conmon
and runc from the system. ``available()`` says whether they are there. The CRI-O tests are
always collected: without CRI-O they fail (``Crio.start`` says why), unless the caller leaves
them out on purpose with ``NRI_CNI_NO_CRIO=1`` (``left_out()``), and then the run says how
many it left out.

One instance has everything under its temp dir: config, storage (vfs: no mounts), run dirs,
namespace pins, NRI plugin dirs, logs; its sockets in a short private dir. The config is a
main file with the private paths and a drop-in dir holding the shipped
``config/crio/crio.conf.d/10-nri-cni.conf`` as it is, followed by the test's own drop-in
(paths only, and whatever a test asks for): what an admin installs is what runs. The pause
image is imported with copyimg in a private mount namespace (it writes under /var/lib and
/var/tmp whatever its flags say).

CRI-O puts a few things outside its dirs: libcni's cache entries (/var/lib/cni/results) and
the pods' cgroups (under a parent of this instance's own). ``cleanup()`` removes those of this
instance's pods, after removing the pods and stopping CRI-O by its PID.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import tomllib
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support import toml_write
from tests.support.containerd import (
    CNI_RESULTS_DIR,
    _RecordingCriClient,
    cgroup_dirs,
    kill_cgroup_procs,
    remove_cgroup_trees,
    umount_under,
)
from tests.support.cri import CriClient, compile_cri, deps_prefix
from tests.support.pause.image import PauseImage, build_pause_image
from tests.support.runtime_proc import RuntimeProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DROPIN = REPO_ROOT / "config" / "crio" / "crio.conf.d" / "10-nri-cni.conf"
SHIPPED_SHIM_CONFLIST = REPO_ROOT / "config" / "crio" / "net.d" / "10-nri-cni.conflist"
RUNC = Path("/usr/sbin/runc")

_live: weakref.WeakSet[Crio] = weakref.WeakSet()
# crio's warning on a CNI DEL that failed; the pod sandbox's id closes its name
_FAILED_TEARDOWN = re.compile(r"Failed to destroy network for pod sandbox \S*\(([0-9a-f]{64})\)")


def bin_dir() -> Path:
    return deps_prefix() / "crio" / "bin"


def conmon_path() -> str | None:
    return shutil.which("conmon", path="/usr/bin:/usr/sbin:/bin:/sbin")


def available() -> bool:
    """crio, pinns and copyimg unpacked by .ci/install-deps, and conmon installed."""
    return all(os.access(bin_dir() / b, os.X_OK) for b in ("crio", "pinns", "copyimg")) and bool(
        conmon_path()
    )


OPT_OUT = "NRI_CNI_NO_CRIO"  # =1: the caller leaves the CRI-O tests out (a machine without CRI-O)


def left_out() -> bool:
    return os.environ.get(OPT_OUT) == "1"


def is_crio_test(nodeid: str) -> bool:
    """An end-to-end test of CRI-O: tests/e2e/test_crio_*.py, and the CRI-O cases of a test
    written for both runtimes (an id `[crio]` or `[crio-...]`)."""
    path, _, rest = nodeid.partition("::")
    if Path(path).parts[:2] != ("tests", "e2e"):
        return False
    return Path(path).name.startswith("test_crio_") or re.search(r"\[crio[\]-]", rest) is not None


class Tally:
    """How the CRI-O tests of a run ended, for .ci/run: written to $NRI_CNI_CRIO_REPORT as
    JSON when that variable is set: whether CRI-O is there, how many CRI-O tests each file
    collected, how many passed, failed, were skipped or deselected (by -m or -k), and how many
    the caller left out (NRI_CNI_NO_CRIO=1)."""

    def __init__(self) -> None:
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "deselected": 0, "left_out": 0}
        self.files: dict[str, int] = {}
        self._left_out: set[str] = set()

    def collected(self, items: Any) -> list[Any]:
        """Counts the CRI-O tests among `items`; returns those the caller leaves out."""
        crio = [i for i in items if is_crio_test(i.nodeid)]
        for item in crio:
            name = Path(item.nodeid.split("::", 1)[0]).name
            self.files[name] = self.files.get(name, 0) + 1
        if not left_out():
            return []
        self._left_out = {i.nodeid for i in crio}
        self.counts["left_out"] = len(crio)
        return crio

    def deselected(self, items: Any) -> None:
        self.counts["deselected"] += sum(
            1 for i in items if is_crio_test(i.nodeid) and i.nodeid not in self._left_out
        )

    def report(self, report: Any) -> None:
        if not is_crio_test(report.nodeid):
            return
        if report.skipped:
            self.counts["skipped"] += 1
        elif report.failed:
            self.counts["failed"] += 1
        elif report.when == "call":
            self.counts["passed"] += 1

    def summary(self) -> str | None:
        """The line a run that left the CRI-O tests out ends with."""
        if not self.counts["left_out"]:
            return None
        return f"{OPT_OUT}=1: {self.counts['left_out']} CRI-O test(s) left out, not run"

    def write(self) -> None:
        path = os.environ.get("NRI_CNI_CRIO_REPORT")
        if path:
            report = {"available": available(), "collected": sum(self.files.values()), "files": self.files}
            Path(path).write_text(json.dumps({**report, **self.counts}) + "\n")


def install_shim_conflist(conf_dir: Path, daemon_socket: str) -> None:
    """CRI-O's network dir holding only the shipped shim list, its daemon socket pointed at
    `daemon_socket` (the one change an admin makes for a non-default socket)."""
    shim_list = json.loads(SHIPPED_SHIM_CONFLIST.read_text())
    for plugin in shim_list["plugins"]:
        if plugin["type"] == "nri-cni-shim":
            plugin["daemonSocket"] = daemon_socket
    for old in conf_dir.glob("*.conflist"):
        old.unlink()
    (conf_dir / SHIPPED_SHIM_CONFLIST.name).write_text(json.dumps(shim_list))


class CrioError(RuntimeError):
    pass


class Crio(RuntimeProcess):
    """One crio process with private dirs. Not running until ``start()``."""

    name = "crio"
    error = CrioError

    def __init__(
        self,
        tmpdir: str | os.PathLike[str],
        *,
        cni_conf_dir: str | os.PathLike[str],
        cni_bin_dirs: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
        default_network: str | None = None,
        nri_request_timeout: str | None = None,
        extra: Mapping[str, Any] | None = None,
        pause: PauseImage | None = None,
        log_level: str = "info",
        start_timeout: float = 30.0,
        sock_dir: str | os.PathLike[str] | None = None,
        nri_socket: str | None = None,
        cgroup_parent: str | None = None,
    ) -> None:
        self.tmpdir = Path(tmpdir).resolve()
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.tag = secrets.token_hex(4)
        # short (sun_path); removed by cleanup(), CRI-O empties it at start (its seccomp dir)
        self.sock_dir = Path(sock_dir or tempfile.mkdtemp(prefix=f"ncrio-{self.tag}-"))
        self.address = str(self.sock_dir / "crio.sock")
        self.nri_socket = nri_socket or str(self.sock_dir / "nri.sock")
        self.cni_conf_dir = Path(cni_conf_dir)
        self.cni_bin_dirs = [str(d) for d in cni_bin_dirs]
        self.default_network = default_network
        self.nri_request_timeout = nri_request_timeout
        self.extra = dict(extra or {})
        self.pause = pause or build_pause_image()
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.cgroup_parent = cgroup_parent or f"/ncrio-{self.tag}"
        self.config_path = self.tmpdir / "crio.conf"
        self.config_dir = self.tmpdir / "crio.conf.d"
        self.storage_conf = self.tmpdir / "storage.conf"
        self.registries_conf = self.tmpdir / "registries.conf"
        self.log_path = self.tmpdir / "crio.log"
        self.storage = self.tmpdir / "storage"
        self.run_dir = self.tmpdir / "run"
        self.etc = self.tmpdir / "etc"
        self.ns_dir = self.tmpdir / "ns"
        self.nri_plugin_dir = self.tmpdir / "nri" / "plugins"
        self.nri_plugin_config_dir = self.tmpdir / "nri" / "conf.d"
        self.proc: subprocess.Popen[bytes] | None = None
        self._cri: CriClient | None = None
        self._image_imported = False
        self._known_pods: set[str] = set()
        # the netns pins of the pods a PodSandboxStatus showed; the others under ns_dir are
        # CRI-O's own leftovers (a creation its kill cut), unmounted by cleanup() like the rest
        self.known_netns: set[str] = set()
        self.start_seconds: float | None = None
        compile_cri()
        _live.add(self)

    def keep_at_exit(self) -> None:
        """Not cleaned up when this Python process exits (the local node's CRI-O outlives it)."""
        _live.discard(self)

    # -- config --------------------------------------------------------------------------------

    def main_config(self) -> dict[str, Any]:
        d = self.tmpdir
        return {
            "crio": {
                "root": str(self.storage),
                "runroot": str(self.run_dir / "storage"),
                "storage_driver": "vfs",
                "log_dir": str(d / "pod-logs"),
                "version_file": str(self.run_dir / "version"),
                "version_file_persist": "",
                "clean_shutdown_file": str(d / "lib" / "clean.shutdown"),
                "api": {"listen": self.address, "stream_address": "127.0.0.1", "stream_port": "0"},
                "runtime": {
                    "default_runtime": "runc",
                    "cgroup_manager": "cgroupfs",
                    "drop_infra_ctr": True,
                    "namespaces_dir": str(self.ns_dir),
                    "pinns_path": str(bin_dir() / "pinns"),
                    "hooks_dir": [str(self.etc / "hooks.d")],
                    "cdi_spec_dirs": [str(self.etc / "cdi")],
                    "decryption_keys_path": str(self.etc / "keys") + "/",
                    "irqbalance_config_file": str(self.etc / "irqbalance"),
                    "irqbalance_config_restore_file": "disable",
                    "container_exits_dir": str(self.run_dir / "exits"),
                    "container_attach_socket_dir": str(self.run_dir),
                    "enable_criu_support": False,
                    # CRI-O's own hostport chains off: portmap does it
                    "disable_hostport_mapping": True,
                    "runtimes": {
                        "runc": {
                            "runtime_path": str(RUNC),
                            "runtime_root": str(self.run_dir / "runc"),
                            "runtime_type": "oci",
                            "monitor_path": conmon_path() or "conmon",
                            "monitor_cgroup": "pod",
                        }
                    },
                },
                "image": {
                    "pause_image": self.pause.ref,
                    "signature_policy": str(self.etc / "policy.json"),
                    "signature_policy_dir": str(self.etc / "policies"),
                    "namespaced_auth_dir": str(self.etc / "auth"),
                    "big_files_temporary_dir": str(d / "tmp"),
                },
                "metrics": {"enable_metrics": False},
            }
        }

    def test_dropin(self) -> dict[str, Any]:
        """Read after the shipped drop-in: only this instance's paths, plus what a test asks."""
        network: dict[str, Any] = {
            "network_dir": str(self.cni_conf_dir) + "/",
            "plugin_dirs": self.cni_bin_dirs,
        }
        if self.default_network is not None:
            network["cni_default_network"] = self.default_network
        nri: dict[str, Any] = {
            "nri_listen": self.nri_socket,
            "nri_plugin_dir": str(self.nri_plugin_dir),
            "nri_plugin_config_dir": str(self.nri_plugin_config_dir),
        }
        if self.nri_request_timeout is not None:
            nri["nri_plugin_request_timeout"] = self.nri_request_timeout
        cfg = {"crio": {"network": network, "nri": nri}}
        return toml_write.deep_merge(cfg, self.extra)

    def write_config(self) -> None:
        for p in (
            self.storage,
            self.run_dir / "exits",
            self.ns_dir,
            self.etc / "hooks.d",
            self.etc / "cdi",
            self.etc / "keys",
            self.etc / "policies",
            self.etc / "auth",
            self.tmpdir / "tmp",
            self.tmpdir / "lib",
            self.tmpdir / "pod-logs",
            self.nri_plugin_dir,
            self.nri_plugin_config_dir,
            self.config_dir,
        ):
            p.mkdir(parents=True, exist_ok=True)
        (self.etc / "policy.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        self.storage_conf.write_text(
            toml_write.dumps(
                {
                    "storage": {
                        "driver": "vfs",
                        "graphroot": str(self.storage),
                        "runroot": str(self.run_dir / "storage"),
                    }
                }
            )
        )
        self.registries_conf.write_text("unqualified-search-registries = []\n")
        (self.tmpdir / "registries.conf.d").mkdir(exist_ok=True)
        self.config_path.write_text(toml_write.dumps(self.main_config()))
        # the shipped drop-in byte for byte, then the test's (later files win)
        shutil.copyfile(SHIPPED_DROPIN, self.config_dir / SHIPPED_DROPIN.name)
        (self.config_dir / "99-ncrio-test.conf").write_text(toml_write.dumps(self.test_dropin()))

    def crio_argv(self) -> list[str]:
        return [
            str(bin_dir() / "crio"),
            "--config",
            str(self.config_path),
            "--config-dir",
            str(self.config_dir),
            "--registries-conf",
            str(self.registries_conf),
            "--registries-conf-dir",
            str(self.tmpdir / "registries.conf.d"),
            "--log-level",
            self.log_level,
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CONTAINERS_STORAGE_CONF"] = str(self.storage_conf)
        env["PATH"] = f"{bin_dir()}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def running_config(self) -> dict[str, Any]:
        """The configuration the running CRI-O logged at its last start (all files merged)."""
        marker = 'msg="Current CRI-O configuration:'
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if marker in ln]
        if not lines:
            raise CrioError(f"no configuration in {self.log_path}")
        quoted = lines[-1].split(" msg=", 1)[1]
        quoted = quoted[: quoted.rindex('"') + 1]  # logrus quotes the message like JSON
        text = json.loads(quoted).split("\n", 1)[1]
        return tomllib.loads(text)

    # -- process -------------------------------------------------------------------------------

    @property
    def cri(self) -> CriClient:
        if self._cri is None:
            self._cri = _CrioCriClient(self, self.address, cgroup_parent=self.cgroup_parent)
        return self._cri

    def start(self) -> None:
        if self.running:
            raise CrioError("already running")
        if not available():
            raise CrioError(
                f"no CRI-O in {bin_dir()} (or no conmon): run .ci/install-deps with CRI-O in "
                f"$NRI_CNI_CRIO_DIR (default ../shared/crio), or set {OPT_OUT}=1 to leave the CRI-O tests out"
            )
        self.write_config()
        if not self._image_imported:
            self.import_pause()
            self._image_imported = True
        for sock in (self.address, self.nri_socket):
            Path(sock).unlink(missing_ok=True)
        t0 = self._spawn(self.crio_argv(), self.env())
        try:
            self._wait_ready(t0)
            self.start_seconds = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def import_pause(self) -> None:
        self.import_image(self.pause)

    def import_image(self, image: PauseImage) -> None:
        """An image archive into this instance's storage, with copyimg in a private mount
        namespace (tmpfs over /var/lib and /var/tmp: it writes there whatever its flags say)."""
        copy = [
            str(bin_dir() / "copyimg"),
            "--root",
            str(self.storage),
            "--runroot",
            str(self.run_dir / "storage"),
            "--storage-driver",
            "vfs",
            "--signature-policy",
            str(self.etc / "policy.json"),
            "--image-name",
            image.ref,
            "--import-from",
            f"oci-archive:{image.archive}",
        ]
        script = 'mount -t tmpfs none /var/lib && mount -t tmpfs none /var/tmp && exec "$@"'
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *copy],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env(),
        )
        if proc.returncode != 0:
            raise CrioError(f"copyimg failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")

    # -- what it leaves outside its dirs -------------------------------------------------------

    def _remember_pod(self, pod_id: str, netns: str | None = None) -> None:
        self._known_pods.add(pod_id)
        if netns:
            self.known_netns.add(netns)

    def cni_cache_entries(self, pod_id: str) -> list[Path]:
        """libcni's cache entries CRI-O wrote for the pod (/var/lib/cni/results)."""
        return sorted(CNI_RESULTS_DIR.glob(f"*-{pod_id}-*"))

    def failed_teardowns(self) -> set[str]:
        """The pods whose CNI DEL CRI-O logged as failed. CRI-O then drops its libcni cache
        entry and marks the pod's network stopped all the same (server/sandbox_network.go,
        networkStop), so it never runs that DEL again: whatever the plugins still held for the
        pod (its eth0's lease) is CRI-O's leak. Seen when a SIGTERM cancels a stop in flight
        ("context canceled")."""
        found = set()
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = _FAILED_TEARDOWN.search(line)
            if match:
                found.add(match.group(1))
        return found

    def netns_pins(self) -> list[str]:
        """The network namespace pins of this instance's pods that exist now."""
        d = self.ns_dir / "netns"
        try:
            return sorted(str(d / n) for n in os.listdir(d))
        except FileNotFoundError:
            return []

    def cleanup(self) -> list[str]:
        """Remove every pod, stop CRI-O, then remove what it left outside its dirs.
        Returns the problems (empty when all went well)."""
        problems: list[str] = []
        pods = set(self._known_pods) | self.remove_listed_pods(problems)
        try:
            self.stop()
        except Exception as exc:
            problems.append(f"stop: {exc}")
        _live.discard(self)
        tops = cgroup_dirs(self.cgroup_parent)
        kill_cgroup_procs(tops)  # conmon and containers, if a test made any
        for pod_id in pods:
            for entry in self.cni_cache_entries(pod_id):
                entry.unlink(missing_ok=True)
        problems += remove_cgroup_trees(tops)
        umount_under((self.tmpdir, self.sock_dir), problems)
        for d in (self.storage, self.run_dir, self.ns_dir, self.tmpdir / "tmp", self.tmpdir / "lib"):
            shutil.rmtree(d, ignore_errors=True)
            if d.exists():
                problems.append(f"could not remove {d}")
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        return problems


class CrioCriClient(CriClient):
    """A CRI client for CRI-O whose pods give each container its own PID namespace: a pod-wide
    one makes CRI-O run an infra container even with drop_infra_ctr, whose oom_score_adj of
    -998 a container of this test bed may not set. CRI-O pins the pods' network namespaces
    all the same."""

    def pod_config(self, *args: Any, **kwargs: Any) -> Any:
        cfg = super().pod_config(*args, **kwargs)
        cfg.linux.security_context.namespace_options.pid = self.pb.NamespaceMode.CONTAINER
        return cfg


class _CrioCriClient(_RecordingCriClient, CrioCriClient):
    """The instance's client: containerd's recording one (it calls ``_remember_pod`` for each
    pod it sees) with CRI-O's pod config."""


@atexit.register
def _cleanup_leftovers() -> None:
    """Never leave a crio running, even when a test run is interrupted."""
    for inst in list(_live):
        try:
            inst.cleanup()
        except Exception:
            pass
