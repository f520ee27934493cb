"""The node the recovery, fault and runtime tests share (they import the `rnode` fixture): a
private containerd with the shim as its only CNI network, nri-cni as a real process that can be
killed and started again, the real plugins, a scriptable "ctl" plugin, and leak checks.

Networks: `podnet` (eth0: bridge, host-local, portmap with the pod's host port: per-pod iptables
DNAT chains; FINALIZE plugin fake-finalize)
and `fastnet` (net1: macvlan over a veth master the test made, host-local), both default, in
10.246.64.0/18. The ctl plugin (CTL_PLUGIN) is a CNI plugin whose behaviour files in a control
dir decide: `add-code` (ADD fails with that CNI code), `del-fail` (DEL fails), `status-fail`
(STATUS fails with code 50), `gc-sleep` (GC takes that long); otherwise ADD passes prevResult on
and the rest succeed. Every call is logged to `calls` as [command, container id, netns, time,
the GC's valid container ids].

Faults come from outside, as a node sees them: the block plugin (tests/plugins/block_plugin.py,
installed as `block`) holds a CNI call while the test kills nri-cni by PID (`kill9`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from nri_cni.local import proto as localproto
from tests.plugins.block_plugin import BlockControl
from tests.support.bin_dir import install_plugin, install_test_plugin, python_script
from tests.support.conflists import bridge_conflist, host_local, macvlan_conflist, network, portmap
from tests.support.hostlocal import host_local_reservations
from tests.support.janitor import Janitor
from tests.support.jsonlines import read_json_lines
from tests.support.leaks import LeakChecker
from tests.support.names import unique_name
from tests.support.nricni import NriCni, ShimSetup
from tests.support.podtruth import RuntimePod, whole_problems

CTL_PLUGIN = r"""
import json, os, sys, time
command = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.buffer.read()
conf = json.loads(raw) if raw.strip() else {}
ctl = conf.get("control", "")
def flag(name):
    try:
        with open(os.path.join(ctl, name)) as f:
            return f.read().strip() or "1"
    except OSError:
        return None
valid = [a["containerID"] for a in conf.get("cni.dev/valid-attachments", [])]
with open(os.path.join(ctl, "calls"), "a") as f:
    f.write(json.dumps([command, os.environ.get("CNI_CONTAINERID", ""),
                        os.environ.get("CNI_NETNS", ""), time.time(), valid]) + "\n")
def fail(code, msg):
    sys.stdout.write(json.dumps({"cniVersion": conf.get("cniVersion", "1.1.0"), "code": code,
                                 "msg": msg}))
    sys.exit(1)
if command == "ADD":
    code = flag("add-code")
    if code:
        fail(int(code), "ctl: ADD refused as told")
    res = conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}
    sys.stdout.write(json.dumps(res))
elif command == "DEL" and flag("del-fail"):
    fail(111, "ctl: DEL fails as told")
elif command == "GC" and flag("gc-sleep"):
    time.sleep(float(flag("gc-sleep")))
elif command == "STATUS" and flag("status-fail"):
    fail(50, "ctl: upstream agent unreachable")
elif command == "VERSION":
    sys.stdout.write(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
"""


def install_ctl(bin_dir: Path) -> None:
    install_plugin(bin_dir, "ctl", python_script(CTL_PLUGIN))


def read_calls(control: Path) -> list[list]:
    return read_json_lines(control / "calls")


def _subnets() -> tuple[str, str]:
    """Two /24s of 10.246.64.0/18 for one test (random: tests run one after another, but a
    failed one may leave a bridge address behind until its cleanup)."""
    third = random.randrange(64, 128, 2)
    return f"10.246.{third}.0/24", f"10.246.{third + 1}.0/24"


class RecoveryNode:
    def __init__(self, tmp_path: Path, make_containerd, make_bridge_network=None) -> None:
        self.tmp = tmp_path
        self._make_containerd = make_containerd
        self._make_bridge_network = make_bridge_network
        self.primary = None  # containerd's own network, in secondary mode
        self.jan = Janitor()
        self.setup = ShimSetup(tmp_path)
        self.bridge = unique_name("br")
        self.jan.track_link(self.bridge)
        self.master, _ = self.jan.veth()
        self.control = tmp_path / "ctl"
        self.control.mkdir()
        install_ctl(self.setup.bin_dir)
        install_test_plugin(self.setup.bin_dir, "block_plugin", "block")
        self.block = BlockControl(tmp_path / "block")
        self.finalize_log = tmp_path / "finalize.log"
        self.eth0_subnet, self.net1_subnet = _subnets()
        self.daemons: list[NriCni] = []
        self.ctd = None
        self.daemon: NriCni | None = None

    # -- config ------------------------------------------------------------------------------

    def podnet(self, *, extra_plugins=(), finalize=True, version="1.1.0") -> dict:
        # ipMasq stays off (bridge_conflist): the bridge plugin skips its masquerade teardown
        # when DEL runs without a netns (docs/reliability.md, "Known limits")
        ipam = host_local(self.setup.ipam_dir, self.eth0_subnet)
        conf = bridge_conflist("podnet", self.bridge, ipam, version=version, then=[portmap(), *extra_plugins])
        if finalize:
            conf["finalize_plugins"] = [{"type": "fake-finalize", "log": str(self.finalize_log)}]
        return network(conf)

    def fastnet(self) -> dict:
        ipam = host_local(self.setup.ipam_dir, self.net1_subnet)
        return network(macvlan_conflist("fastnet", self.master, ipam, version="1.0.0"))

    def ctl_plugin(self) -> dict:
        return {"type": "ctl", "control": str(self.control)}

    def block_plugin(self, *commands: str) -> dict:
        """The block plugin in a chain: it holds these commands while `self.block` is armed."""
        return {"type": "block", "block": self.block.config(armed=True, commands=list(commands))}

    def ctl(self, name: str, value: str | None) -> None:
        """Sets (value) or clears (None) one of the ctl plugin's behaviour files."""
        path = self.control / name
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(value)

    def ctl_calls(self) -> list[list]:
        return read_calls(self.control)

    # -- processes ---------------------------------------------------------------------------

    def start_containerd(self, **kw):
        self.ctd = self._make_containerd(
            cni_conf_dir=self.setup.conf_dir, cni_bin_dirs=[self.setup.bin_dir], **kw
        )
        return self.ctd

    def start_secondary(self, net1: dict, **extra) -> NriCni:
        """containerd with its own bridge network (eth0) and nri-cni in secondary mode adding
        `net1` in NRI RunPodSandbox."""
        self.primary = self._make_bridge_network(
            bridge=unique_name("cb"), subnet=self.eth0_subnet, name=f"cbr0-{uuid.uuid4().hex[:6]}"
        )
        # generous: a timed-out NRI request would make containerd run a pod without nri-cni
        self.ctd = self._make_containerd(cni_conf_dir=self.primary.conf_dir, nri_request_timeout="15s")
        cfg = self.daemon_config([net1], mode="secondary", primary_network=self.primary.name, **extra)
        cfg["cni"]["runtime_cache_dir"] = "/var/lib/cni"  # containerd's; it cannot be moved
        return self.start_daemon(cfg)

    def daemon_config(
        self, networks: list[dict], *, mode: str = "shim", nri_socket: str | None = None, **extra
    ) -> dict:
        extra.setdefault("gc", {"interval": 0})
        extra.setdefault("status", {"interval": 0})
        return self.setup.config(nri_socket or self.ctd.nri_socket, networks, mode=mode, **extra)

    def _daemon_for(self, cfg: dict) -> NriCni:
        if self.daemon is None or self.daemon.cfg is not cfg:
            self.daemon = NriCni(self.tmp, cfg)
            self.daemons.append(self.daemon)
        return self.daemon

    def start_daemon(self, cfg: dict, *, wait: bool = True) -> NriCni:
        """Starts nri-cni (again: same state, cache and log) and waits until it registered and
        finished what a Synchronize starts (GC, repair)."""
        daemon = self._daemon_for(cfg)
        mark = daemon.log_path.stat().st_size if daemon.log_path.exists() else 0
        daemon.start(wait_registered=wait)
        if wait:
            wait_settled(daemon, mark)
        return daemon

    def spawn_daemon(self, cfg: dict) -> NriCni:
        """Starts nri-cni without waiting for anything: its start-up recovery runs before it
        answers at all, and a test may kill it in the middle."""
        daemon = self._daemon_for(cfg)
        daemon.config_path.write_text(yaml.safe_dump(cfg))
        with open(daemon.log_path, "ab") as log:
            daemon.proc = subprocess.Popen(
                [sys.executable, "-m", "nri_cni.cli", "run", "--config", str(daemon.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=daemon.env,
            )
        return daemon

    def kill9(self) -> int:
        """SIGKILL to nri-cni by its PID (an OOM kill, a node's kill -9); its exit status.
        Plugins it started live on (each runs in a process group of its own)."""
        assert self.daemon is not None and self.daemon.proc is not None
        os.kill(self.daemon.proc.pid, signal.SIGKILL)
        return self.wait_dead()

    def wait_dead(self, timeout: float = 60) -> int:
        assert self.daemon is not None and self.daemon.proc is not None
        return self.daemon.proc.wait(timeout)

    # -- looking at the node -----------------------------------------------------------------

    def reservations(self):
        return host_local_reservations(self.setup.ipam_dir)

    def reserved_for(self, pod_id: str) -> list:
        return [r for r in self.reservations() if r.container_id == pod_id]

    def cache_files(self) -> list[str]:
        d = self.setup.cache_dir / "results"
        return sorted(os.listdir(d)) if d.exists() else []

    def intents(self) -> list[str]:
        d = self.setup.state_dir / "intents"
        return sorted(os.listdir(d)) if d.exists() else []

    def bridge_ports(self) -> list[str]:
        try:
            return sorted(os.listdir(f"/sys/class/net/{self.bridge}/brif"))
        except FileNotFoundError:
            return []

    def runtime_pods(self, *, ready_only: bool = True) -> list[RuntimePod]:
        """The pods containerd lists (READY ones by default), with the IPs it reports."""
        out = []
        for pod in self.ctd.cri.list_pods():
            if ready_only and not pod.ready:
                continue
            st = self.ctd.cri.pod_status(pod.id)
            out.append(RuntimePod(pod.id, st.netns_path or "", st.ips))
        return out

    def not_whole(self, interfaces=("eth0", "net1")) -> list[str]:
        """Every READY pod containerd lists, checked against its netns (netlink): problems."""
        return [p for pod in self.runtime_pods() for p in whole_problems(pod, interfaces)]

    def leak_checker(self, *netns) -> LeakChecker:
        return LeakChecker(
            dirs=[self.setup.cache_dir, self.setup.ipam_dir, self.setup.state_dir],
            bridges=[self.bridge],
            netns=list(netns),
        )

    def run_pod(self, name: str, *, ports: bool = True, **kw) -> str:
        pm = (
            [{"protocol": "tcp", "container_port": 80, "host_port": random.randrange(20000, 40000)}]
            if ports
            else []
        )
        return self.ctd.cri.run_pod(name, "nct-e2e", str(uuid.uuid4()), port_mappings=pm, **kw)

    def remove_pod(self, pod_id: str) -> None:
        self.ctd.cri.stop_pod(pod_id)
        self.ctd.cri.remove_pod(pod_id)

    def remove_all_leaving_nothing(self, pod_ids, checker: LeakChecker) -> None:
        """Removes the pods; then no IP, cache entry, intent record, bridge port or anything
        else `checker` knows of is left."""
        for pod_id in pod_ids:
            self.remove_pod(pod_id)
        assert self.reservations() == []
        assert self.cache_files() == []
        assert self.intents() == []
        assert self.bridge_ports() == []
        leaks = checker.leaks()
        assert leaks == [], "\n".join(leaks)

    def cleanup(self) -> list[str]:
        """Also after a failed test: the pods go through the daemon while it runs (their DELs
        release what they hold), then a GC finds nothing valid left."""
        self.block.disarm()
        self.block.release_all()  # no plugin of this test stays blocked
        alive = self.daemon is not None and self.daemon.proc is not None and self.daemon.proc.poll() is None
        if alive and self.ctd is not None and self.ctd.running:
            try:
                for pod in self.ctd.cri.list_pods():
                    try:
                        self.remove_pod(pod.id)
                    except Exception:
                        pass
                self.daemon.ask("gc")
            except Exception:
                pass
        for d in self.daemons:
            if d.proc and d.proc.poll() is None:
                d.stop()
        failed = self.jan.cleanup()
        self.setup.cleanup()
        return failed


def wait_settled(daemon: NriCni, log_offset: int = 0, timeout: float = 60) -> None:
    """Until the daemon has synchronized, the GC that follows logged its result (in the log
    written after `log_offset`), the work that Synchronize started (GC, then a verify round)
    has ended and no repair is pending. The timeout only fails a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            raise AssertionError(f"nri-cni exited ({daemon.proc.returncode}):\n{daemon.log_tail()}")
        try:
            st = daemon.status()
        except (OSError, localproto.LocalProtocolError, RuntimeError):
            time.sleep(0.05)
            continue
        with open(daemon.log_path, "rb") as f:
            f.seek(log_offset)
            text = f.read().decode(errors="replace")
        idle = st["tracked"]["background"] == 0 and not st["pendingRepair"]
        if st["nri"]["synchronized"] and "nri_cni.pod: gc:" in text and idle:
            return
        time.sleep(0.05)
    raise AssertionError(f"nri-cni did not settle:\n{daemon.log_tail()}")


def pod_ids_in(daemon: NriCni) -> dict[str, list[str]]:
    """`nri-cni pods`: pod id -> interfaces, for the pods that have any (the report also lists
    the runtime's pods without an attachment; in secondary mode eth0 is the runtime's)."""
    pods = {p["id"]: [n["interface"] for n in p["network-status"]] for p in daemon.pods()}
    return {pod: ifs for pod, ifs in pods.items() if ifs}


@pytest.fixture
def rnode(tmp_path, make_bridge_network, make_containerd):
    # torn down in reverse: this node (pods through the daemon), containerd, then its network
    node = RecoveryNode(tmp_path, make_containerd, make_bridge_network)
    yield node
    failed = node.cleanup()
    if failed:
        pytest.fail(f"cleanup: {failed}")
