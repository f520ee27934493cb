"""What nri-cni knows about a pod and what it attached to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# CNI_ARGS keys Kubernetes runtimes pass (containerd, CRI-O); plugins like portmap and
# host-local read them, and the cache keeps them so `nri-cni pods` can name the pod later.
K8S_POD_NAMESPACE = "K8S_POD_NAMESPACE"
K8S_POD_NAME = "K8S_POD_NAME"
K8S_POD_INFRA_CONTAINER_ID = "K8S_POD_INFRA_CONTAINER_ID"
K8S_POD_UID = "K8S_POD_UID"


@dataclass(frozen=True)
class PodInfo:
    """A pod sandbox, from NRI (PodSandbox) or from a CNI call forwarded by the shim."""

    id: str
    name: str = ""
    namespace: str = ""
    uid: str = ""
    netns: str = ""  # "" for host-network pods, or once the runtime removed it
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_nri(cls, pod: Any) -> PodInfo:
        netns = ""
        for ns in pod.linux.namespaces:
            if ns.type == "network":
                netns = ns.path
        return cls(
            id=pod.id,
            name=pod.name,
            namespace=pod.namespace,
            uid=pod.uid,
            netns=netns,
            annotations=dict(pod.annotations),
        )

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
    result: Any  # nri_cni.cni.result.Result
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
