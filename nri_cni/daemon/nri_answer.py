"""NRI messages <-> the pod plan's plain types, on the daemon side: the pod layer never sees
a protobuf. PodSandbox -> PodInfo for every event; the pod's networks -> the RunPodSandbox
answer (NRI-native mode); a container's Adjustment (daemon/adjust.py) -> the CreateContainer
answer.

`RunPodSandboxResponse.adjust.network.ips` is NRI PR #295's shape (plain addresses, primary
first). `interfaces`, `routes` and `dns` are nri-cni's extension of PodSandboxNetwork (fields
1001-1003, see proto/nri.proto): every in-pod interface of every network with its IPs and its
metadata map, so a runtime can report more than one IP per pod and say where each came from.
"""

from __future__ import annotations

from nri_cni.api import nri_pb2
from nri_cni.daemon.adjust import Adjustment
from nri_cni.pod.model import PodInfo, PodNetworks

# Metadata keys nri-cni sets itself live under cni.dev/ (reserved for the runtime side).
META_NETWORK = "cni.dev/network"
META_PRIMARY = "cni.dev/primary"


def pod_info(pod: nri_pb2.PodSandbox) -> PodInfo:
    """The pod of an NRI event (its netns: the "network" namespace's path, "" for host network)."""
    netns = ""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            netns = ns.path
    return PodInfo(
        id=pod.id,
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        netns=netns,
        annotations=dict(pod.annotations),
        ips=tuple(pod.ips),
        pid=pod.pid,
    )


def to_pod_network(answer: PodNetworks) -> nri_pb2.PodSandboxNetwork:
    net = nri_pb2.PodSandboxNetwork(ips=answer.ips())
    dns_done = False
    for position, att in enumerate(answer.attachments):
        result = att.result
        for index, iface in enumerate(result.interfaces):
            if not iface.sandbox:
                continue  # host-side ends (bridge, veth peer) are not the pod's
            out = net.interfaces.add(
                network=att.network,
                name=iface.name,
                mac=iface.mac,
                mtu=iface.mtu,
                sandbox=iface.sandbox,
                pci_id=iface.pci_id,
                socket_path=iface.socket_path,
            )
            for ip in result.ips:
                if ip.interface == index:
                    out.ips.add(address=ip.address, gateway=ip.gateway)
            out.metadata.update(iface.metadata)
            out.metadata[META_NETWORK] = att.network
            out.metadata[META_PRIMARY] = "true" if position == 0 else "false"
        for route in result.routes:
            net.routes.add(
                network=att.network,
                dst=route.dst,
                gw=route.gw,
                mtu=route.mtu,
                table=route.table or 0,
                scope=route.scope or 0,
                interface=att.ifname,
            )
        dns = result.dns
        if not dns_done and (dns.nameservers or dns.domain or dns.search or dns.options):
            net.dns.nameservers.extend(dns.nameservers)
            net.dns.domain = dns.domain
            net.dns.search.extend(dns.search)
            net.dns.options.extend(dns.options)
            dns_done = True
    return net


def run_pod_response(answer: PodNetworks) -> nri_pb2.RunPodSandboxResponse:
    return nri_pb2.RunPodSandboxResponse(adjust=nri_pb2.PodSandboxAdjustment(network=to_pod_network(answer)))


def container_response(adjustment: Adjustment) -> nri_pb2.CreateContainerResponse:
    """CreateContainerResponse.adjust: the annotations and the bind mounts."""
    adjust = nri_pb2.ContainerAdjustment(annotations=adjustment.annotations)
    for mount in adjustment.mounts:
        adjust.mounts.add(
            destination=mount.destination, type="bind", source=mount.source, options=mount.options
        )
    return nri_pb2.CreateContainerResponse(adjust=adjust)
