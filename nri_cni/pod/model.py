"""What nri-cni knows about a pod and what it attached to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nri_cni.cni.cache import CacheEntry, ResultCache
from nri_cni.cni.result import Result

# CNI_ARGS keys Kubernetes runtimes pass (containerd, CRI-O); plugins like portmap and
# host-local read them, and the cache keeps them so `nri-cni pods` can name the pod later.
K8S_POD_NAMESPACE = "K8S_POD_NAMESPACE"
K8S_POD_NAME = "K8S_POD_NAME"
K8S_POD_INFRA_CONTAINER_ID = "K8S_POD_INFRA_CONTAINER_ID"
K8S_POD_UID = "K8S_POD_UID"


Key = tuple[str, str]  # one attachment of a pod: (network, ifname); a network may come twice


@dataclass(frozen=True)
class PodInfo:
    """A pod sandbox, from NRI (PodSandbox) or from a CNI call forwarded by the shim."""

    id: str
    name: str = ""
    namespace: str = ""
    uid: str = ""
    netns: str = ""  # "" for host-network pods, or once the runtime removed it
    annotations: dict[str, str] = field(default_factory=dict)
    # the IPs the runtime reports for the pod (NRI PodSandbox.ips: shim mode, what the runtime's
    # CNI call returned; native mode, what nri-cni's RunPodSandbox answer gave it); () unknown
    ips: tuple[str, ...] = ()
    # the pod's pause process as the runtime last reported it (NRI PodSandbox.pid); 0 unknown
    # or stopped. A running pause keeps the pod's netns alive whatever happens to its path.
    pid: int = 0

    @property
    def host_network(self) -> bool:
        return not self.netns

    def cni_args(self) -> list[tuple[str, str]]:
        args = []
        if self.namespace:
            args.append((K8S_POD_NAMESPACE, self.namespace))
        if self.name:
            args.append((K8S_POD_NAME, self.name))
        args.append((K8S_POD_INFRA_CONTAINER_ID, self.id))
        if self.uid:
            args.append((K8S_POD_UID, self.uid))
        return args

    def label(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else self.id[:12]


@dataclass
class NetworkAttachment:
    """One network attached to one pod (what the cache entry holds, plus timings)."""

    network: str
    ifname: str
    result: Result
    add_ms: float = 0.0
    finalize_ms: float = 0.0


@dataclass
class PodNetworks:
    """The answer for one pod: every attachment in attachment order."""

    pod: PodInfo
    attachments: list[NetworkAttachment] = field(default_factory=list)

    def ips(self) -> list[str]:
        """Pod IPs without prefix length, primary network first, de-duplicated."""
        out: list[str] = []
        for att in self.attachments:
            for ip in att.result.ips:
                addr = ip.address.split("/", 1)[0]
                if addr not in out:
                    out.append(addr)
        return out


@dataclass(frozen=True)
class AttachRequest:
    """What a caller adds to a pod's ADD (the shim: the runtime's CNI call)."""

    runtime_caps: dict[str, Any] = field(default_factory=dict)  # port mappings, bandwidth...: to the primary
    primary_ifname: str = ""  # the primary's interface name, as the runtime asked for it
    # (network, ifname) -> the addresses its ADD asks the IPAM for (a repair: the same IPs again),
    # as CNI_ARGS `IP=` and the `ips` capability; plain or with a prefix length
    ips: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    # the caller answers with the first network's result alone (the shim's CNI result): the
    # others' MAC and MTU are not read from the pod's netns for it (NRI's answer shows them all)
    first_answered: bool = False


@dataclass(frozen=True)
class PrimaryNetwork:
    """The pod's primary network (eth0) and who attaches it, as the mode says."""

    name: str  # config's primary_network; "" = the first default network
    ours: bool  # True: nri-cni attaches it first, as eth0; False: the runtime's own network


@dataclass(frozen=True)
class RuntimePrimary:
    """The runtime's own primary network (secondary mode) and the runtime's libcni cache that
    holds its result of each pod: FINALIZE runs for it too."""

    network: str
    cache: ResultCache = field(compare=False)

    def entry(self, pod_id: str) -> CacheEntry | None:
        """The pod's eth0 entry of the network; None: the runtime cached no result."""
        return self.cache.read(self.network, pod_id, "eth0")
