"""nri-cni's configuration as typed values: defaults, the settings dataclasses, Config."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CONFIG_PATH = "/etc/nri-cni/config.yaml"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_DAEMON_SOCKET = "/run/nri-cni/nri-cni.sock"
DEFAULT_STATE_DIR = "/var/lib/nri-cni"
# nri-cni keeps its attachments in a cache dir of its own (libcni layout, like Multus does with
# /var/lib/cni/multus) so that it never mistakes the runtime's own attachments for its own.
DEFAULT_CACHE_DIR = "/var/lib/cni/nri-cni"
DEFAULT_RUNTIME_CACHE_DIR = "/var/lib/cni"
DEFAULT_BIN_DIRS = ("/opt/cni/bin",)
DEFAULT_FINALIZE_DIR = "/etc/cni/net.d/_finalize.d"

MODES = ("shim", "native", "secondary")
FAILURE_POLICIES = ("auto", "fail", "keep")
_PLUGIN_NAME = re.compile(r"^[a-zA-Z0-9_.+-]+$")
_PLUGIN_IDX = re.compile(r"^[0-9]{2}$")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_K8S_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class NriSettings:
    socket: str = DEFAULT_NRI_SOCKET
    plugin_name: str = "cni"
    plugin_index: str = "10"
    # What nri-cni asks the runtime for in ConfigureResponse (NRI PR #304); 0 = do not ask.
    request_timeout: float = 0.0


@dataclass(frozen=True)
class CniSettings:
    bin_dirs: tuple[str, ...] = DEFAULT_BIN_DIRS
    cache_dir: str = DEFAULT_CACHE_DIR
    plugin_timeout: float = 60.0
    finalize_dir: str = DEFAULT_FINALIZE_DIR
    # Where the runtime's own libcni writes its cache (secondary mode reads the primary's result).
    runtime_cache_dir: str = DEFAULT_RUNTIME_CACHE_DIR
    # names of the daemon's environment variables passed on to plugins (besides PATH and CNI_*)
    plugin_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class LifecycleSettings:
    """INIT / DEINIT retries (docs/lifecycle.md): back-off doubles from initial up to max."""

    retry_initial: float = 1.0
    retry_max: float = 300.0


@dataclass(frozen=True)
class ReloadSettings:
    """Hot reload: inotify on the files' directories, and a periodic rescan as the fallback."""

    watch: bool = True
    rescan_interval: float = 30.0  # 0 = no rescan
    debounce: float = 0.2  # events closer than this are one change (an editor's several writes)


@dataclass(frozen=True)
class LocalSocketSettings:
    """Who may use the daemon's local socket and how much one connection may take
    (docs/security.md). The shim runs as root inside the runtime, so root is the default."""

    allowed_uids: tuple[int, ...] = (0,)
    allowed_gids: tuple[int, ...] = ()
    max_connections: int = 128
    read_timeout: float = 10.0  # for the whole request; the answer may take as long as the pod
    max_request_bytes: int = 4 * 1024 * 1024 + 64 * 1024


@dataclass(frozen=True)
class PodLimits:
    """What one pod may ask for (its annotation is written by whoever may create the pod)."""

    networks_per_pod: int = 8
    attachments_per_network: int = 2
    # A pod's networks are ADDed at once (each chain in its order, FINALIZE after all), at most
    # this many of one pod together (1: one after another) ...
    parallel_per_pod: int = 4
    # ... and at most this many ADDs on the node together (read at start-up)
    parallel_per_node: int = 16


@dataclass(frozen=True)
class MetricsServerSettings:
    max_connections: int = 16
    timeout: float = 5.0  # to read a request, and to write the answer


@dataclass(frozen=True)
class NetworkContainers:
    """`networks[].containers`: what a container learns of this network (each also needs the
    global switch of `containers:` on)."""

    annotations: bool = True
    file: bool = True
    sockets: bool = True


@dataclass(frozen=True)
class ContainerSettings:
    """`containers:` what nri-cni adds to a container at NRI CreateContainer (docs/containers.md):
    the network-status annotations, the status file, and the vhost-user sockets' directories
    (only those under `socket_dirs`)."""

    annotations: bool = True
    file: bool = True
    sockets: bool = True
    socket_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class NetworkSpec:
    """One network nri-cni may attach: a CNI network list plus how pods get it."""

    name: str
    conflist: Any  # nri_cni.cni.config.NetworkConfigList
    interface: str = ""  # "" = assigned in order: eth0 for the primary, then net1, net2, ...
    default: bool = False  # attached to every pod
    namespaces: tuple[str, ...] = ()  # who may ask for it by annotation; "*" = every namespace
    nad: str = ""  # "namespace/name" of the NetworkAttachmentDefinition it came from (nri_cni/config/nad.py)
    containers: NetworkContainers = field(default_factory=NetworkContainers)

    def allowed_in(self, namespace: str) -> bool:
        return "*" in self.namespaces or namespace in self.namespaces


@dataclass(frozen=True)
class Config:
    path: str = ""
    mode: str = "shim"
    nri: NriSettings = field(default_factory=NriSettings)
    daemon_socket: str = DEFAULT_DAEMON_SOCKET
    state_dir: str = DEFAULT_STATE_DIR
    log_level: str = "info"
    log_format: str = "text"
    cni: CniSettings = field(default_factory=CniSettings)
    networks: tuple[NetworkSpec, ...] = ()
    nad_dir: str = ""  # NetworkAttachmentDefinition files (nri_cni/config/nad.py)
    # Secondary mode: the runtime's own network (its result is read from the runtime's cache and
    # FINALIZE runs for it too). Other modes: the network whose result is the pod's primary one.
    primary_network: str = ""
    failure_policy: str = "auto"
    gc_interval: float = 600.0
    gc_parallel: int = 0  # stale pods GC detaches at once; 0: sized for the machine (pod/upkeep.py)
    # seconds an attached pod the runtime does not list stays valid for GC (service/roster.py)
    gc_unlisted_grace: float = 120.0
    status_interval: float = 30.0
    refuse_when_not_ready: bool = False
    repair_on_sync: bool = True
    # #17: verify every pod's networks against the node (netlink) every `verify_interval`
    # seconds, with the chain's CNI CHECK every `verify_check_every` rounds; `repair`: "on"
    # (repair what differs), "verify-only" (report it, touch nothing), "off" (no verify timer)
    verify_interval: float = 30.0
    verify_check_every: int = 10
    repair: str = "on"
    metrics_listen: str = ""
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    reload: ReloadSettings = field(default_factory=ReloadSettings)
    local: LocalSocketSettings = field(default_factory=LocalSocketSettings)
    limits: PodLimits = field(default_factory=PodLimits)
    metrics_server: MetricsServerSettings = field(default_factory=MetricsServerSettings)
    # files.trust: conf dirs, network lists and plugin binaries another user can write are
    # refused ("enforce") or only warned about ("warn", for development).
    trust_files: bool = True
    containers: ContainerSettings = field(default_factory=ContainerSettings)

    def network(self, name: str) -> NetworkSpec | None:
        for net in self.networks:
            if net.name == name:
                return net
        return None

    @property
    def default_networks(self) -> tuple[NetworkSpec, ...]:
        return tuple(n for n in self.networks if n.default)

    @property
    def primary(self) -> NetworkSpec | None:
        if self.mode == "secondary":
            return None
        if self.primary_network:
            return self.network(self.primary_network)
        defaults = self.default_networks
        return defaults[0] if defaults else None
